//! A job running on the reactors: stop, statistics, results.

use super::*;

#[derive(Debug)]
pub(super) struct ReactorHandle<O> {
    pub(super) info: ReactorInfo,
    pub(super) control: Sender<Control>,
    pub(super) replies: Receiver<Snapshot>,
    pub(super) thread: JoinHandle<Option<(O, Snapshot)>>,
}

/// A job running on the reactors.
#[derive(Debug)]
pub struct Run<O> {
    pub(super) reactors: Vec<ReactorHandle<O>>,
}

/// What one reactor returned.
#[derive(Debug)]
pub struct ReactorResult<O> {
    pub info: ReactorInfo,
    pub output: O,
    pub stats: Snapshot,
}

impl<O> Run<O> {
    pub fn reactors(&self) -> Vec<ReactorInfo> {
        self.reactors.iter().map(|r| r.info.clone()).collect()
    }

    /// Each running reactor's statistics so far (a reactor that finished has none to give).
    pub fn stats(&self) -> Vec<Snapshot> {
        self.reactors
            .iter()
            .filter(|r| !r.thread.is_finished() && r.control.send(Control::Stats).is_ok())
            .filter_map(|r| r.replies.recv_timeout(Duration::from_secs(2)).ok())
            .collect()
    }

    /// Adds `device` (the run's device `index`, on `controllers`) to the reactors `serving`
    /// (indices into [`Run::reactors`]) while the job runs: each opens its queue pairs on it
    /// and hands it to its job ([`Job::device_added`]) as its share. Waits for every one;
    /// the first failure says why (the others use the device all the same).
    pub fn add_device(
        &self,
        index: usize,
        device: &Arc<dyn BlockDevice>,
        controllers: &[Controller],
        serving: &[usize],
    ) -> Result<(), String> {
        let (done, answers) = bounded(serving.len());
        let mut asked = 0;
        for (k, &r) in serving.iter().enumerate() {
            let Some(reactor) = self.reactors.get(r) else {
                continue;
            };
            let added = Added {
                index,
                device: device.clone(),
                controllers: controllers.to_vec(),
                share: Share {
                    index: k,
                    of: serving.len(),
                },
                done: done.clone(),
            };
            if reactor.control.send(Control::Add(Box::new(added))).is_ok() {
                asked += 1;
            }
        }
        drop(done);
        let mut result = Ok(());
        for _ in 0..asked {
            // (a reactor that ended drops its message: its answer never comes)
            match answers.recv_timeout(Duration::from_secs(60)) {
                Ok(answer) => result = result.and(answer),
                Err(_) => return result.and(Err("a reactor did not answer".into())),
            }
        }
        result
    }

    /// Asks every reactor to stop: it stops submitting, drains, and finishes its job.
    pub fn stop(&self) {
        for r in &self.reactors {
            let _ = r.control.send(Control::Stop);
        }
    }

    pub fn is_finished(&self) -> bool {
        self.reactors.iter().all(|r| r.thread.is_finished())
    }

    /// Waits for every reactor.
    pub fn wait(self) -> Result<Vec<ReactorResult<O>>, EngineError> {
        let mut results = Vec::new();
        let mut failure = None;
        for r in self.reactors {
            let cpu = r.info.cpu;
            match r.thread.join() {
                Ok(Some((output, stats))) => results.push(ReactorResult {
                    info: r.info,
                    output,
                    stats,
                }),
                Ok(None) => {}
                Err(_) => {
                    failure = Some(EngineError::Reactor {
                        cpu,
                        what: "its job panicked".into(),
                    })
                }
            }
        }
        match failure {
            Some(e) => Err(e),
            None => Ok(results),
        }
    }
}

//! The README's embedding example runs.

#[path = "../examples/embed.rs"]
mod embed;

#[test]
fn the_embedding_example_runs() {
    embed::main().expect("the example runs on simulated drives");
}

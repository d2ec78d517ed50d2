#![no_main]

// Arbitrary commands from a well-behaved host to serve's admin and I/O queues: each answered
// exactly once.
libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    usnvme_engine::fabric::export::fuzz::fuzz_commands(data)
});

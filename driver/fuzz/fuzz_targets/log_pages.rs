#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| usnvme_driver::fuzzing::log_pages(data));

#![no_main]

// Bytes from a host to one connection of the NVMe/TCP target (`usnvme serve`).
libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    usnvme_engine::fabric::export::fuzz::fuzz_connection(data)
});

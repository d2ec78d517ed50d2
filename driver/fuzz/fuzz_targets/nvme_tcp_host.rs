#![no_main]

// Bytes from a target to the host side of NVMe/TCP (ICResp, CapsuleResp, C2HData, R2T,
// C2HTermReq): never a panic, never a loop without end.
libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    usnvme_engine::fabric::host::fuzz::fuzz_host(data);
});

#![no_main]

// Bytes from a target to the host side's one NVMe/TCP PDU engine, the polled session (ICResp,
// the Connect response, CapsuleResp, C2HData, R2T, C2HTermReq): never a panic, never a loop
// without end, every command completed once.
libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    usnvme_engine::transport::tcp::initiator::fuzz::fuzz_host(data);
});

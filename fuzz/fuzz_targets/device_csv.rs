#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let _ = fedsel::fuzzing::device_csv(data);
});

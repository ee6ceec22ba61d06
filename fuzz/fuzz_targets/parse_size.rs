//! The size parser never panics, and whatever it accepts is a non-zero multiple of 4 KiB.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(text) = std::str::from_utf8(data)
        && let Ok(size) = profiler::size::parse_size(text)
    {
        assert!(size.bytes() > 0 && size.bytes() % 4096 == 0);
    }
});

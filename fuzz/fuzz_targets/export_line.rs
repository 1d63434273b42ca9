#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| steadfast_cli::fuzzing::export_line(data));

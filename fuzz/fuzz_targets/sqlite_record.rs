#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| steadfast_cli::fuzzing::sqlite_record(data));

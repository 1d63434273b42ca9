#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| steadfast_cli::fuzzing::flow_file(data));

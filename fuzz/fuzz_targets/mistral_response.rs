#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| commitpoint::fuzzing::mistral_response(data));

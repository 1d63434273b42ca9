//! The `steadfast` command; everything lives in the library.

fn main() {
    std::process::exit(steadfast_cli::main());
}

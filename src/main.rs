fn main() -> std::process::ExitCode {
    commitpoint::cli::main()
}

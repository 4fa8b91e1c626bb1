//! `fedsel-ocs`: the whole fedsel command line (run, sweep, report, results) with `ocs`
//! beside the built-in strategies: register, then hand over.

fn main() -> std::process::ExitCode {
    if let Err(e) = fedsel_example_ocs::register() {
        eprintln!("error: {e}");
        return std::process::ExitCode::from(2);
    }
    std::process::ExitCode::from(fedsel_cli::main_with_args(std::env::args_os()))
}

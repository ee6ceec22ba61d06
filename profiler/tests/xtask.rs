//! What xtask assumes about dmaprof's command line, checked against the clap definition.
use clap::CommandFactory as _;

#[path = "../../xtask/src/vm/run_options.rs"]
mod run_options;

#[test]
fn xtask_knows_every_run_option_that_takes_a_value() {
    let cli = profiler::cli::Cli::command();
    let run = cli.find_subcommand("run").expect("dmaprof has `run`");
    let (mut short, mut long) = (Vec::new(), Vec::new());
    for arg in run
        .get_arguments()
        .filter(|a| a.get_action().takes_values() && !a.is_positional())
    {
        short.extend(arg.get_short());
        long.extend(arg.get_long().map(|l| format!("--{l}")));
    }
    short.sort_unstable();
    long.sort_unstable();
    assert_eq!(
        short,
        run_options::VALUED_SHORT,
        "xtask/src/vm/run_options.rs: VALUED_SHORT"
    );
    assert_eq!(
        long,
        run_options::VALUED_LONG,
        "xtask/src/vm/run_options.rs: VALUED_LONG"
    );
}

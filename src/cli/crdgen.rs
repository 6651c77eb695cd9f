//! `agentrun crdgen`: writes the CustomResourceDefinitions generated from the Rust types, with the
//! admission policies and RBAC roles installed beside them.

use std::path::PathBuf;
use std::process::ExitCode;

/// Arguments of `agentrun crdgen`.
#[derive(Debug, clap::Args)]
pub struct CrdgenArgs {
    /// The folder to write agent.yaml, agentrun.yaml, approvalrequest.yaml,
    /// admission-policies.yaml and roles.yaml into.
    #[arg(long, value_name = "DIR", default_value = "crds")]
    pub out: PathBuf,
    /// The Helm chart whose `crds/` and `files/` get copies of the CRDs and admission policies
    /// (skipped when the folder does not exist).
    #[arg(long, value_name = "DIR", default_value = "charts/agentrun")]
    pub chart: PathBuf,
}

/// Writes the CRDs, admission policies and roles into `--out`, printing each path written. Exit
/// code 1 with the error on stderr when a file cannot be written.
pub fn main(args: CrdgenArgs) -> ExitCode {
    match crate::crd::write_crds(&args.out) {
        Ok(paths) => {
            for path in &paths {
                println!("{}", path.display());
            }
            if args.chart.is_dir() {
                for path in &paths {
                    let Some(name) = path.file_name().and_then(|n| n.to_str()) else {
                        continue;
                    };
                    // The chart installs CRDs from crds/ and templates the policies from files/;
                    // the user roles are the chart's own templates.
                    let folder = match name {
                        "admission-policies.yaml" => "files",
                        "roles.yaml" => continue,
                        _ => "crds",
                    };
                    let target = args.chart.join(folder).join(name);
                    if let Err(err) = std::fs::copy(path, &target) {
                        eprintln!(
                            "agentrun crdgen: cannot copy to {}: {err}",
                            target.display()
                        );
                        return ExitCode::FAILURE;
                    }
                    println!("{}", target.display());
                }
            }
            ExitCode::SUCCESS
        }
        Err(err) => {
            eprintln!("agentrun crdgen: {err}");
            ExitCode::FAILURE
        }
    }
}

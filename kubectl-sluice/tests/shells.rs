//! The completion scripts in the real shells: bash (calling the completion function as
//! readline would), zsh (a pseudo-terminal with `zsh/zpty`, pressing TAB, both from
//! `$fpath` and sourced) and fish (`complete -C`). `scripts/install/test-deps.sh` installs
//! zsh and fish.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::process::Command;

const BIN: &str = env!("CARGO_BIN_EXE_kubectl-sluice");

/// (command line up to the cursor, candidates that must be offered).
const CASES: &[(&str, &[&str])] = &[
    ("kubectl-sluice ex", &["explain"]),
    ("kubectl-sluice st", &["status"]),
    ("kubectl-sluice explain -o ", &["json", "text", "yaml"]),
    ("kubectl-sluice validate --i", &["--ingress-class"]),
    ("kubectl-sluice completion ", &["bash", "fish", "zsh"]),
    ("kubectl-sluice status --out", &["--output"]),
    ("kubectl-sluice diff --ag", &["--against"]),
];

/// A directory holding the binary and the scripts, on `PATH` for the shells.
fn workdir(tag: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("sluice-shells-{tag}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::copy(BIN, dir.join("kubectl-sluice")).unwrap();
    for shell in ["bash", "zsh", "fish"] {
        let out = Command::new(BIN)
            .args(["completion", shell])
            .output()
            .unwrap();
        assert!(out.status.success());
        let name = match shell {
            "zsh" => "_kubectl-sluice".to_owned(),
            s => format!("kubectl-sluice.{s}"),
        };
        std::fs::write(dir.join(name), out.stdout).unwrap();
    }
    dir
}

fn shell(name: &str) -> PathBuf {
    for d in std::env::var("PATH").unwrap_or_default().split(':') {
        let p = Path::new(d).join(name);
        if p.is_file() {
            return p;
        }
    }
    panic!("{name} is not installed: run scripts/install/test-deps.sh");
}

fn run(shell_path: &Path, dir: &Path, script: &str) -> String {
    let path = format!(
        "{}:{}",
        dir.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let out = Command::new(shell_path)
        .arg("-c")
        .arg(script)
        .env("PATH", path)
        .env("HOME", dir)
        .current_dir(dir)
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn check(shell: &str, line: &str, got: &str, want: &[&str]) {
    let offered: Vec<&str> = got
        .lines()
        .map(|l| l.split('\t').next().unwrap_or_default().trim())
        .collect();
    for w in want {
        assert!(
            offered.contains(w),
            "{shell}: `{line}<TAB>` does not offer {w}; offered {offered:?}"
        );
    }
}

#[test]
fn bash_completes_subcommands_flags_and_values() {
    let bash = shell("bash");
    let dir = workdir("bash");
    for (line, want) in CASES {
        // As readline calls it: COMP_WORDS split at spaces, the cursor at the last word.
        let script = format!(
            "source ./kubectl-sluice.bash\n\
             line='{line}'\n\
             read -ra COMP_WORDS <<< \"$line\"\n\
             [[ \"$line\" == *' ' ]] && COMP_WORDS+=('')\n\
             COMP_CWORD=$(( ${{#COMP_WORDS[@]}} - 1 ))\n\
             COMP_LINE=\"$line\"; COMP_POINT=${{#line}}\n\
             fn=$(complete -p kubectl-sluice | sed -n 's/.*-F \\([^ ]*\\).*/\\1/p')\n\
             \"$fn\" kubectl-sluice \"${{COMP_WORDS[COMP_CWORD]}}\" \"${{COMP_WORDS[COMP_CWORD-1]}}\"\n\
             printf '%s\\n' \"${{COMPREPLY[@]}}\"\n"
        );
        check("bash", line, &run(&bash, &dir, &script), want);
    }
    std::fs::remove_dir_all(&dir).ok();
}

/// Presses TAB after `line` in an interactive zsh on a pseudo-terminal and prints every
/// candidate the completion system was given (`compadd` wrapped). `setup` loads the script.
fn zsh_script(setup: &str, line: &str) -> String {
    format!(
        r#"zmodload zsh/zpty
zpty z zsh -f -i
zpty -w z 'PROMPT=; {setup}; m=QQ'
zpty -w z 'compadd () {{ builtin compadd -O __hits "$@"; print -r -- "${{m}}ZZ${{(j:,:)__hits}}"; builtin compadd "$@" }}'
zpty -w z '{line}'$'\t'
out=
for i in {{1..100}}; do
  if zpty -r -t z chunk; then out+=$chunk
  elif [[ $out == *QQZZ* ]]; then sleep 0.1; zpty -r -t z chunk && out+=$chunk; break
  else sleep 0.05; fi
done
zpty -d z
print -r -- "$out" | tr '\r' '\n' | grep -a 'QQZZ' | sed 's/.*QQZZ//' | tr ',' '\n'
"#
    )
}

#[test]
#[ignore = "system tier: zsh (scripts/install/test-deps.sh installs it; scripts/test.sh runs this)"]
fn zsh_completes_from_fpath_and_when_sourced() {
    let zsh = shell("zsh");
    let dir = workdir("zsh");
    let d = dir.display();
    let setups = [
        (
            "fpath",
            format!("fpath=({d} $fpath); autoload -U compinit; compinit -u -d {d}/.zcd-fpath"),
        ),
        (
            "sourced",
            format!(
                "autoload -U compinit; compinit -u -d {d}/.zcd-src; source {d}/_kubectl-sluice"
            ),
        ),
    ];
    for (how, setup) in &setups {
        for (line, want) in CASES {
            let got = run(&zsh, &dir, &zsh_script(setup, line));
            check(&format!("zsh ({how})"), line, &got, want);
        }
    }
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
#[ignore = "system tier: fish (scripts/install/test-deps.sh installs it; scripts/test.sh runs this)"]
fn fish_completes_subcommands_flags_and_values() {
    let fish = shell("fish");
    let dir = workdir("fish");
    for (line, want) in CASES {
        let script = format!("source ./kubectl-sluice.fish; complete -C '{line}'");
        check("fish", line, &run(&fish, &dir, &script), want);
    }
    std::fs::remove_dir_all(&dir).ok();
}

/// `kubectl_complete-sluice` (a link to the binary), as kubectl 1.26+ runs it for
/// `kubectl sluice <TAB>`: cobra's `__complete` answer, the directive last.
#[test]
fn kubectl_plugin_completion_answers_in_cobras_format() {
    let dir = workdir("kubectl");
    let link = dir.join("kubectl_complete-sluice");
    std::os::unix::fs::symlink(dir.join("kubectl-sluice"), &link).unwrap();
    let ask = |args: &[&str]| {
        let out = Command::new(&link).args(args).output().unwrap();
        assert!(out.status.success());
        String::from_utf8(out.stdout).unwrap()
    };
    for (line, want) in CASES {
        let mut words: Vec<&str> = line.split(' ').skip(1).collect();
        if line.ends_with(' ') {
            words.pop();
            words.push("");
        }
        let got = ask(&words);
        assert!(got.ends_with(":4\n") || got.ends_with(":0\n"), "{got}");
        check("kubectl plugin", line, &got, want);
    }
    // A flag taking a path lets kubectl complete file names (directive 0).
    assert!(ask(&["validate", "-f", ""]).ends_with(":0\n"));
    assert_eq!(ask(&["explain", "-o", "j"]), "json\n:4\n");
    std::fs::remove_dir_all(&dir).ok();
}

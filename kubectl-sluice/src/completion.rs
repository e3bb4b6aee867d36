//! `completion bash|zsh|fish`: completion scripts generated from the `clap::Command` itself
//! (its subcommands, their flags, the values of value enums, which flags take paths), so a
//! new flag is completed without anyone editing a script. Small and deterministic: the
//! same binary always prints the same script.

use std::fmt::Write as _;

use clap::{Arg, ArgAction, ValueHint};

/// A shell `completion` writes a script for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Shell {
    /// bash (`source <(kubectl-sluice completion bash)`).
    Bash,
    /// zsh (a `_kubectl-sluice` file on `$fpath`).
    Zsh,
    /// fish (`~/.config/fish/completions/kubectl-sluice.fish`).
    Fish,
}

/// One flag or positional argument, as the scripts need it.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Flag {
    long: Option<String>,
    short: Option<char>,
    help: String,
    /// Whether it takes a value.
    takes_value: bool,
    /// The values it accepts, when they are a fixed set (value enums).
    values: Vec<String>,
    /// Whether its value is a path.
    path: bool,
    /// Whether it may be given more than once.
    repeat: bool,
}

/// One subcommand with its flags and positionals.
#[derive(Debug, Clone)]
struct Sub {
    name: String,
    help: String,
    flags: Vec<Flag>,
    positionals: Vec<Flag>,
}

/// The first line of an argument's help, without a trailing period.
fn first_line(help: Option<&clap::builder::StyledStr>) -> String {
    let text = help.map(ToString::to_string).unwrap_or_default();
    let line = text.lines().next().unwrap_or_default().trim();
    let line = line.split(". ").next().unwrap_or(line);
    line.trim_end_matches('.').to_owned()
}

fn flag(arg: &Arg) -> Flag {
    let takes_value = arg.get_action().takes_values();
    Flag {
        long: arg.get_long().map(str::to_owned),
        short: arg.get_short(),
        help: first_line(arg.get_help()),
        takes_value,
        values: if takes_value {
            arg.get_possible_values()
                .iter()
                .filter(|v| !v.is_hide_set())
                .map(|v| v.get_name().to_owned())
                .collect()
        } else {
            Vec::new()
        },
        path: matches!(
            arg.get_value_hint(),
            ValueHint::AnyPath | ValueHint::FilePath | ValueHint::DirPath
        ),
        repeat: matches!(arg.get_action(), ArgAction::Append | ArgAction::Count),
    }
}

/// The model of `cmd`: its flags, and each subcommand's (in declaration order).
fn model(cmd: &clap::Command) -> (Vec<Flag>, Vec<Sub>) {
    let mut cmd = cmd.clone();
    // NB: building adds clap's own `--help`, `--version` and `help` subcommand, which the
    // user can type too.
    cmd.build();
    let top = cmd
        .get_arguments()
        .filter(|a| !a.is_hide_set() && !a.is_positional())
        .map(flag)
        .collect();
    let subs = cmd
        .get_subcommands()
        .filter(|s| !s.is_hide_set())
        .map(|s| Sub {
            name: s.get_name().to_owned(),
            help: first_line(s.get_about()),
            flags: s
                .get_arguments()
                .filter(|a| !a.is_hide_set() && !a.is_positional())
                .map(flag)
                .collect(),
            positionals: s
                .get_arguments()
                .filter(|a| !a.is_hide_set() && a.is_positional())
                .map(flag)
                .collect(),
        })
        .collect();
    (top, subs)
}

/// The completion script of `cmd` for `shell`.
pub fn generate(cmd: &clap::Command, shell: Shell) -> String {
    let bin = cmd.get_name().to_owned();
    let (top, subs) = model(cmd);
    match shell {
        Shell::Bash => bash(&bin, &top, &subs),
        Shell::Zsh => zsh(&bin, &top, &subs),
        Shell::Fish => fish(&bin, &top, &subs),
    }
}

/// The file name kubectl (1.26+) runs to complete `kubectl sluice <TAB>`: an executable of
/// this name on `PATH` (a link to `kubectl-sluice`) is called with the words after
/// `sluice`, the last one being the word under the cursor.
pub const KUBECTL_COMPLETE: &str = "kubectl_complete-sluice";

/// cobra's directives, the last line of a `__complete` answer.
const DIRECTIVE_DEFAULT: u32 = 0;
const DIRECTIVE_NO_FILE: u32 = 4;

/// Answers a completion request as a cobra program's `__complete` does (what kubectl's
/// plugin completion expects): candidates one per line, `value\tdescription`, then
/// `:<directive>` (0: also complete file names, 4: do not). `args` are the words after
/// the command name; the last is the (possibly empty) word being completed.
pub fn complete(cmd: &clap::Command, args: &[String]) -> String {
    let (top, subs) = model(cmd);
    let (current, before) = match args.split_last() {
        Some((c, b)) => (c.as_str(), b),
        None => ("", &[][..]),
    };
    let sub = before
        .iter()
        .find_map(|w| subs.iter().find(|s| s.name == *w));
    let flags: &[Flag] = sub.map_or(&top[..], |s| &s.flags[..]);
    let mut out = String::new();
    let mut directive = DIRECTIVE_NO_FILE;
    let spelled = |f: &Flag, w: &str| spellings(f).iter().any(|s| s == w);
    // A flag waiting for its value (`-o <TAB>`)?
    let pending = before
        .last()
        .and_then(|w| flags.iter().find(|f| f.takes_value && spelled(f, w)));
    if let Some(f) = pending {
        if f.path {
            directive = DIRECTIVE_DEFAULT;
        }
        for v in f.values.iter().filter(|v| v.starts_with(current)) {
            let _ = writeln!(out, "{v}");
        }
    } else if current.starts_with('-') {
        for f in flags {
            for sp in spellings(f).iter().filter(|sp| sp.starts_with(current)) {
                let _ = writeln!(out, "{sp}\t{}", f.help);
            }
        }
    } else if let Some(sub) = sub {
        // A positional: the first one not given yet (flag values are skipped).
        let mut given = 0;
        let mut skip = false;
        for w in before.iter().skip_while(|w| **w != sub.name).skip(1) {
            if skip {
                skip = false;
            } else if w.starts_with('-') {
                skip = !w.contains('=') && sub.flags.iter().any(|f| f.takes_value && spelled(f, w));
            } else {
                given += 1;
            }
        }
        if let Some(p) = sub.positionals.get(given) {
            if p.path {
                directive = DIRECTIVE_DEFAULT;
            }
            for v in p.values.iter().filter(|v| v.starts_with(current)) {
                let _ = writeln!(out, "{v}");
            }
        }
    } else {
        for s in subs.iter().filter(|s| s.name.starts_with(current)) {
            let _ = writeln!(out, "{}\t{}", s.name, s.help);
        }
    }
    let _ = writeln!(out, ":{directive}");
    out
}

fn spellings(f: &Flag) -> Vec<String> {
    let mut out = Vec::new();
    if let Some(s) = f.short {
        out.push(format!("-{s}"));
    }
    if let Some(l) = &f.long {
        out.push(format!("--{l}"));
    }
    out
}

fn bash(bin: &str, top: &[Flag], subs: &[Sub]) -> String {
    let func = format!("_{}", bin.replace('-', "_"));
    let names: Vec<&str> = subs.iter().map(|s| s.name.as_str()).collect();
    let top_words: Vec<String> = top.iter().flat_map(spellings).collect();
    let mut s = String::new();
    let _ = writeln!(
        s,
        "# bash completion for {bin}; generated by `{bin} completion bash`."
    );
    let _ = writeln!(s, "{func}() {{");
    s.push_str("    local cur prev sub i\n");
    s.push_str("    cur=\"${COMP_WORDS[COMP_CWORD]}\"\n");
    s.push_str("    prev=\"${COMP_WORDS[COMP_CWORD-1]}\"\n");
    s.push_str("    sub=\"\"\n");
    s.push_str("    for ((i = 1; i < COMP_CWORD; i++)); do\n");
    s.push_str("        case \"${COMP_WORDS[i]}\" in\n");
    let _ = writeln!(
        s,
        "            {}) sub=\"${{COMP_WORDS[i]}}\"; break ;;",
        names.join("|")
    );
    s.push_str("        esac\n    done\n    case \"$sub\" in\n");
    let _ = writeln!(
        s,
        "        \"\") COMPREPLY=($(compgen -W \"{} {}\" -- \"$cur\")) ;;",
        names.join(" "),
        top_words.join(" ")
    );
    for sub in subs {
        let _ = writeln!(s, "        {})", sub.name);
        let valued: Vec<&Flag> = sub.flags.iter().filter(|f| f.takes_value).collect();
        if !valued.is_empty() {
            s.push_str("            case \"$prev\" in\n");
            for f in valued {
                let action = if !f.values.is_empty() {
                    format!(
                        "COMPREPLY=($(compgen -W \"{}\" -- \"$cur\"))",
                        f.values.join(" ")
                    )
                } else if f.path {
                    "COMPREPLY=($(compgen -f -- \"$cur\"))".to_owned()
                } else {
                    "COMPREPLY=()".to_owned()
                };
                let _ = writeln!(
                    s,
                    "                {}) {action}; return ;;",
                    spellings(f).join("|")
                );
            }
            s.push_str("            esac\n");
        }
        let mut words: Vec<String> = sub.flags.iter().flat_map(spellings).collect();
        words.extend(
            sub.positionals
                .iter()
                .flat_map(|p| p.values.iter().cloned()),
        );
        let _ = writeln!(
            s,
            "            COMPREPLY=($(compgen -W \"{}\" -- \"$cur\")) ;;",
            words.join(" ")
        );
    }
    s.push_str("    esac\n}\n");
    let _ = writeln!(s, "complete -o default -F {func} {bin}");
    s
}

/// `text` safe inside `[...]` of a zsh `_arguments` spec in single quotes.
fn zsh_escape(text: &str) -> String {
    text.replace('\'', "'\\''")
        .replace('[', "\\[")
        .replace(']', "\\]")
        .replace(':', "\\:")
}

fn zsh_action(f: &Flag) -> String {
    if !f.values.is_empty() {
        format!("({})", f.values.join(" "))
    } else if f.path {
        "_files".to_owned()
    } else {
        String::new()
    }
}

fn zsh_specs(flags: &[Flag], positionals: &[Flag]) -> Vec<String> {
    let mut specs = Vec::new();
    for f in flags {
        let names = spellings(f);
        let help = zsh_escape(&f.help);
        let value = if f.takes_value {
            format!(":value:{}", zsh_action(f))
        } else {
            String::new()
        };
        let star = if f.repeat { "*" } else { "" };
        let exclusive = if names.len() > 1 && !f.repeat {
            format!("({})", names.join(" "))
        } else {
            String::new()
        };
        let set = if names.len() > 1 {
            format!("{{{}}}", names.join(","))
        } else {
            names.concat()
        };
        let prefix = format!("{exclusive}{star}");
        if prefix.is_empty() {
            specs.push(format!("{set}'[{help}]{value}'"));
        } else {
            specs.push(format!("'{prefix}'{set}'[{help}]{value}'"));
        }
    }
    for (i, p) in positionals.iter().enumerate() {
        specs.push(format!(
            "'{}:{}:{}'",
            i + 1,
            zsh_escape(&p.help),
            zsh_action(p)
        ));
    }
    specs
}

fn zsh(bin: &str, top: &[Flag], subs: &[Sub]) -> String {
    let func = format!("_{}", bin.replace('-', "_"));
    let mut s = String::new();
    let _ = writeln!(s, "#compdef {bin}");
    let _ = writeln!(
        s,
        "# zsh completion for {bin}; generated by `{bin} completion zsh`."
    );
    let _ = writeln!(s, "{func}() {{");
    s.push_str("    local -a subcommands\n    subcommands=(\n");
    for sub in subs {
        let _ = writeln!(
            s,
            "        '{}:{}'",
            sub.name,
            zsh_escape(&sub.help)
                .replace("\\[", "[")
                .replace("\\]", "]")
        );
    }
    s.push_str("    )\n    if (( CURRENT == 2 )); then\n");
    let top_specs = zsh_specs(top, &[]);
    let _ = writeln!(
        s,
        "        _arguments {} '1: :->cmd' && return",
        top_specs.join(" ")
    );
    s.push_str("        _describe command subcommands\n        return\n    fi\n");
    s.push_str("    shift words\n    (( CURRENT-- ))\n    case $words[1] in\n");
    for sub in subs {
        let specs = zsh_specs(&sub.flags, &sub.positionals);
        let _ = writeln!(s, "        {})", sub.name);
        if specs.is_empty() {
            s.push_str("            ;;\n");
        } else {
            let _ = writeln!(
                s,
                "            _arguments \\\n                {} ;;",
                specs.join(" \\\n                ")
            );
        }
    }
    s.push_str("    esac\n}\n");
    // NB: autoloaded from `$fpath` (the file `_{bin}`), the file's body is the completion
    // function itself and must complete at once; sourced, it registers the function.
    let _ = writeln!(s, "if [ \"$funcstack[1]\" = \"_{bin}\" ]; then");
    let _ = writeln!(s, "    {func} \"$@\"");
    let _ = writeln!(s, "else");
    let _ = writeln!(s, "    compdef {func} {bin}");
    let _ = writeln!(s, "fi");
    s
}

fn fish_escape(text: &str) -> String {
    text.replace('\\', "\\\\").replace('\'', "\\'")
}

fn fish_flag(s: &mut String, bin: &str, condition: &str, f: &Flag) {
    let _ = write!(s, "complete -c {bin} -n '{condition}'");
    if let Some(c) = f.short {
        let _ = write!(s, " -s {c}");
    }
    if let Some(l) = &f.long {
        let _ = write!(s, " -l {l}");
    }
    if f.takes_value {
        if !f.values.is_empty() {
            let _ = write!(s, " -x -a '{}'", f.values.join(" "));
        } else if f.path {
            s.push_str(" -r -F");
        } else {
            s.push_str(" -x");
        }
    }
    let _ = writeln!(s, " -d '{}'", fish_escape(&f.help));
}

fn fish(bin: &str, top: &[Flag], subs: &[Sub]) -> String {
    let names: Vec<&str> = subs.iter().map(|s| s.name.as_str()).collect();
    let mut s = String::new();
    let _ = writeln!(
        s,
        "# fish completion for {bin}; generated by `{bin} completion fish`."
    );
    let _ = writeln!(s, "complete -c {bin} -f");
    let none = format!("not __fish_seen_subcommand_from {}", names.join(" "));
    for f in top {
        fish_flag(&mut s, bin, &none, f);
    }
    for sub in subs {
        let _ = writeln!(
            s,
            "complete -c {bin} -n '{none}' -a {} -d '{}'",
            sub.name,
            fish_escape(&sub.help)
        );
    }
    for sub in subs {
        let cond = format!("__fish_seen_subcommand_from {}", sub.name);
        for f in &sub.flags {
            fish_flag(&mut s, bin, &cond, f);
        }
        for p in &sub.positionals {
            if !p.values.is_empty() {
                let _ = writeln!(
                    s,
                    "complete -c {bin} -n '{cond}' -x -a '{}' -d '{}'",
                    p.values.join(" "),
                    fish_escape(&p.help)
                );
            }
        }
    }
    s
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;
    use crate::cli::Cli;
    use clap::CommandFactory as _;

    /// Every script names every subcommand, each subcommand's every long flag, and the
    /// values of every value enum; and the output is the same each time.
    #[test]
    fn scripts_list_every_subcommand_flag_and_value() {
        let cmd = Cli::command();
        let (top, subs) = model(&cmd);
        assert!(subs.iter().any(|s| s.name == "status"));
        assert!(subs.iter().any(|s| s.name == "completion"));
        assert!(top.iter().any(|f| f.long.as_deref() == Some("version")));
        for shell in [Shell::Bash, Shell::Zsh, Shell::Fish] {
            let script = generate(&cmd, shell);
            assert_eq!(script, generate(&cmd, shell), "{shell:?} is deterministic");
            for sub in &subs {
                assert!(
                    script.contains(&sub.name),
                    "{shell:?} script lacks {}",
                    sub.name
                );
                for f in &sub.flags {
                    let Some(long) = &f.long else { continue };
                    let spelled = match shell {
                        Shell::Fish => format!("-l {long}"),
                        _ => format!("--{long}"),
                    };
                    assert!(
                        script.contains(&spelled),
                        "{shell:?} script lacks {} {spelled}",
                        sub.name
                    );
                    for v in &f.values {
                        assert!(script.contains(v.as_str()), "{shell:?} lacks value {v}");
                    }
                }
            }
            for v in [
                "json",
                "yaml",
                "bash",
                "zsh",
                "fish",
                "all-namespaces",
                "namespace",
            ] {
                assert!(script.contains(v), "{shell:?} lacks {v}");
            }
        }
    }

    #[test]
    fn path_flags_complete_files() {
        let cmd = Cli::command();
        let bash = generate(&cmd, Shell::Bash);
        assert!(
            bash.contains("-f|--filename) COMPREPLY=($(compgen -f -- \"$cur\")); return ;;"),
            "{bash}"
        );
        assert!(bash.contains("-o|--output) COMPREPLY=($(compgen -W \"text json yaml\""));
        let fish = generate(&cmd, Shell::Fish);
        assert!(fish.contains("-l kubeconfig -r -F"), "{fish}");
        let zsh = generate(&cmd, Shell::Zsh);
        assert!(zsh.contains(":value:_files"), "{zsh}");
        assert!(zsh.contains("(text json yaml)"), "{zsh}");
    }
}

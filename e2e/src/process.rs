//! Running helper programs with errors that show the command line and its output.

use std::ffi::OsStr;
use std::io::Write;
use std::process::{Command, Output, Stdio};

use crate::Error;

/// Renders a command line for messages.
pub(crate) fn describe(cmd: &Command) -> String {
    let mut s = cmd.get_program().to_string_lossy().into_owned();
    for arg in cmd.get_args() {
        s.push(' ');
        s.push_str(&arg.to_string_lossy());
    }
    s
}

/// Runs `cmd` to completion, feeding `stdin` if given; fails only if it cannot be started.
pub(crate) fn run_output(
    cmd: &mut Command,
    stdin: Option<&[u8]>,
    hint: &str,
) -> Result<Output, Error> {
    let command = describe(cmd);
    let spawn_err = |source| Error::Spawn {
        command: command.clone(),
        source,
        hint: hint.to_owned(),
    };
    cmd.stdout(Stdio::piped()).stderr(Stdio::piped());
    cmd.stdin(if stdin.is_some() {
        Stdio::piped()
    } else {
        Stdio::null()
    });
    let mut child = cmd.spawn().map_err(spawn_err)?;
    if let (Some(data), Some(mut pipe)) = (stdin, child.stdin.take()) {
        // NB: a program that exits without reading its input closes the pipe; its exit status
        // then tells the story, so a write error here is not the interesting failure.
        let _ = pipe.write_all(data);
    }
    child
        .wait_with_output()
        .map_err(|e| Error::io(format!("waiting for `{command}`"), e))
}

/// Runs `cmd` and returns its stdout; a non-zero exit is an [`Error::Command`].
pub(crate) fn run_ok(cmd: &mut Command) -> Result<String, Error> {
    let out = run_output(cmd, None, "")?;
    check(cmd, out)
}

/// Turns a finished command's output into its stdout or an [`Error::Command`].
pub(crate) fn check(cmd: &Command, out: Output) -> Result<String, Error> {
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    if out.status.success() {
        return Ok(stdout);
    }
    let mut stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    if stderr.trim().is_empty() {
        stderr = stdout;
    }
    Err(Error::Command {
        command: describe(cmd),
        status: out.status.to_string(),
        stderr,
    })
}

/// `Command::new(program).args(args)`.
pub(crate) fn command<S: AsRef<OsStr>>(program: impl AsRef<OsStr>, args: &[S]) -> Command {
    let mut cmd = Command::new(program);
    cmd.args(args);
    cmd
}

//! The command `record` starts: forked, then held before its exec until the probes watch its
//! pid, so that not one of its ioctls goes unseen.
use std::{
    ffi::CString,
    io::{Read as _, Write as _},
    os::fd::AsRawFd as _,
};

/// Why the command could not be started.
#[derive(Debug, thiserror::Error)]
pub enum LaunchError {
    /// An argument holds a NUL byte, or there is no command.
    #[error("bad command: {0}")]
    Command(String),
    /// pipe or fork failed.
    #[error("cannot start {what}: {error}")]
    Os {
        /// What failed.
        what: &'static str,
        /// The OS error.
        error: std::io::Error,
    },
    /// exec failed (no such file, not executable...).
    #[error("cannot run `{command}`: {error}")]
    Exec {
        /// argv[0].
        command: String,
        /// errno of execvp.
        error: std::io::Error,
    },
}

/// Checks that `command` can be run, as execvp will look for it (as given when it holds a
/// slash, else in PATH), so that a typo is reported before anything is attached.
pub fn check(command: &str) -> Result<(), LaunchError> {
    use std::os::unix::fs::PermissionsExt as _;
    let runnable = |p: &std::path::Path| {
        p.metadata()
            .is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
    };
    let found = if command.contains('/') {
        runnable(std::path::Path::new(command))
    } else {
        let path = std::env::var_os("PATH").unwrap_or_else(|| "/usr/bin:/bin".into());
        std::env::split_paths(&path).any(|d| runnable(&d.join(command)))
    };
    if found {
        Ok(())
    } else {
        Err(LaunchError::Exec {
            command: command.to_owned(),
            error: std::io::Error::from_raw_os_error(libc::ENOENT),
        })
    }
}

/// A forked child that has not run the command yet.
#[derive(Debug)]
pub struct Held {
    /// Its process id.
    pub pid: u32,
    go: std::io::PipeWriter,
    exec_error: std::io::PipeReader,
    command: String,
}

/// Forks a child that waits for [`Held::release`] and then execs `argv` (searched in PATH).
pub fn hold(argv: &[String]) -> Result<Held, LaunchError> {
    let first = argv
        .first()
        .ok_or_else(|| LaunchError::Command("no command given".into()))?;
    let args: Vec<CString> = argv
        .iter()
        .map(|a| CString::new(a.as_bytes()).map_err(|_| LaunchError::Command(format!("{a:?} holds a NUL byte"))))
        .collect::<Result<_, _>>()?;
    let mut ptrs: Vec<*const libc::c_char> = args.iter().map(|a| a.as_ptr()).collect();
    ptrs.push(std::ptr::null());
    let os = |what| move |source| LaunchError::Os { what, error: source };
    // Both pipes close on exec: the child's end of `exec_error` closing tells the parent that
    // exec succeeded.
    let (go_r, go) = std::io::pipe().map_err(os("pipe"))?;
    let (exec_error, err_w) = std::io::pipe().map_err(os("pipe"))?;
    // SAFETY: fork has no preconditions. The child calls only async-signal-safe functions
    // (read, execvp, write, _exit) on memory prepared before the fork, as std's own spawn does.
    let pid = unsafe { libc::fork() };
    if pid == 0 {
        let mut byte = 0u8;
        // SAFETY: see above; every pointer is valid in the child's copy of this stack.
        unsafe {
            // The parent's ends: without closing them the child would keep its own handshake
            // open and never see the parent give up.
            libc::close(go.as_raw_fd());
            libc::close(exec_error.as_raw_fd());
            if libc::read(go_r.as_raw_fd(), (&raw mut byte).cast(), 1) != 1 {
                libc::_exit(126);
            }
            libc::execvp(ptrs[0], ptrs.as_ptr());
            let errno = *libc::__errno_location();
            libc::write(err_w.as_raw_fd(), (&raw const errno).cast(), 4);
            libc::_exit(127);
        }
    }
    if pid < 0 {
        return Err(os("fork")(std::io::Error::last_os_error()));
    }
    Ok(Held {
        pid: pid as u32,
        go,
        exec_error,
        command: first.clone(),
    })
}

impl Held {
    /// Lets the child exec; returns once it has (or says why it could not).
    pub fn release(mut self) -> Result<u32, LaunchError> {
        let os = |what| move |source| LaunchError::Os { what, error: source };
        self.go.write_all(&[1]).map_err(os("the command (handshake)"))?;
        drop(self.go);
        let mut errno = [0u8; 4];
        match self.exec_error.read(&mut errno) {
            Ok(4) => {
                reap(self.pid);
                Err(LaunchError::Exec {
                    command: self.command,
                    error: std::io::Error::from_raw_os_error(i32::from_ne_bytes(errno)),
                })
            }
            _ => Ok(self.pid),
        }
    }

    /// Ends the child without running the command (dmaprof could not watch it).
    pub fn abandon(self) {
        let pid = self.pid;
        drop(self);
        reap(pid);
    }
}

/// Waits for child `pid` to end (it is ending already).
fn reap(pid: u32) {
    let mut status = 0;
    // SAFETY: waitpid writes one int through a valid pointer.
    unsafe { libc::waitpid(pid as i32, &mut status, 0) };
}

/// How child `pid` ended, without waiting: None while it runs; Some(code) once it exited
/// (128+N after signal N).
pub fn try_wait(pid: u32) -> Option<i32> {
    let mut status = 0;
    // SAFETY: waitpid writes one int through a valid pointer.
    let r = unsafe { libc::waitpid(pid as i32, &mut status, libc::WNOHANG) };
    if r != pid as i32 {
        return None;
    }
    if libc::WIFEXITED(status) {
        Some(libc::WEXITSTATUS(status))
    } else {
        Some(128 + libc::WTERMSIG(status))
    }
}

/// Stops child `pid` (SIGTERM) and waits for it; returns how it ended.
pub fn terminate(pid: u32) -> Option<i32> {
    // SAFETY: kill has no memory preconditions; pid is our own unreaped child.
    unsafe { libc::kill(pid as i32, libc::SIGTERM) };
    for _ in 0..100 {
        if let Some(code) = try_wait(pid) {
            return Some(code);
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    // SAFETY: as above.
    unsafe { libc::kill(pid as i32, libc::SIGKILL) };
    reap(pid);
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_held_command_runs_only_when_released() {
        let held = hold(&["sh".into(), "-c".into(), "exit 3".into()]).unwrap();
        assert_eq!(try_wait(held.pid), None, "held before exec");
        let pid = held.release().unwrap();
        let mut code = None;
        for _ in 0..500 {
            code = try_wait(pid);
            if code.is_some() {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        assert_eq!(code, Some(3));
    }

    #[test]
    fn a_missing_command_says_so_and_an_abandoned_one_never_runs() {
        let err = hold(&["/nonexistent/dmaprof-test".into()])
            .unwrap()
            .release()
            .unwrap_err();
        assert!(err.to_string().contains("No such file"), "{err}");
        hold(&["true".into()]).unwrap().abandon();
        assert!(check("sh").is_ok() && check("/bin/sh").is_ok());
        assert!(check("dmaprof-no-such-command").is_err() && check("/etc/passwd").is_err());
        assert!(hold(&[]).is_err());
    }
}

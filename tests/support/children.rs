//! Child processes for tests that run the examples as a user would: each
//! child's output drained as it runs, every child bounded in time, and a
//! failure shown with every side's output.
#![allow(dead_code)]

use std::io::Read;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Every child must be done by then (a TCG guest is slow; the programs'
/// own waits are at most 60 s).
pub const CHILD_LIMIT: Duration = Duration::from_secs(150);
/// Once one side has failed, how long the other may still take.
const GRACE: Duration = Duration::from_secs(15);
/// How often a running child is looked at.
pub const POLL: Duration = Duration::from_millis(20);

/// What a finished (or stopped) child left behind.
pub struct Outcome {
    pub name: String,
    pub status: Option<ExitStatus>,
    /// Why it was killed, if it was.
    pub killed: Option<&'static str>,
    pub stdout: String,
    pub stderr: String,
}

impl Outcome {
    pub fn ok(&self) -> bool {
        self.status.is_some_and(|s| s.success())
    }
}

impl std::fmt::Display for Outcome {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let how = match (self.killed, self.status) {
            (Some(why), _) => format!("killed: {why}"),
            (None, Some(s)) => s.to_string(),
            (None, None) => "killed".to_string(),
        };
        writeln!(f, "----- {} ({how}) stdout:", self.name)?;
        write!(f, "{}", self.stdout)?;
        writeln!(f, "----- {} stderr:", self.name)?;
        write!(f, "{}", self.stderr)
    }
}

/// A child with its output drained by two threads (so a full pipe never
/// blocks it). Killed on drop unless it was waited for.
pub struct Running {
    name: String,
    child: Child,
    status: Option<ExitStatus>,
    killed: Option<&'static str>,
    readers: Option<(JoinHandle<String>, JoinHandle<String>)>,
}

impl Running {
    pub fn spawn(name: &str, cmd: &mut Command) -> Running {
        let mut child = cmd
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {name} ({cmd:?}): {e}"));
        let out = drain(child.stdout.take().expect("piped"));
        let err = drain(child.stderr.take().expect("piped"));
        Running {
            name: name.to_string(),
            child,
            status: None,
            killed: None,
            readers: Some((out, err)),
        }
    }

    /// True once the child has exited.
    pub fn exited(&mut self) -> bool {
        if self.status.is_none() {
            self.status = self.child.try_wait().expect("try_wait");
        }
        self.status.is_some()
    }

    pub fn stop(&mut self, why: &'static str) {
        if !self.exited() {
            self.killed = Some(why);
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }

    pub fn outcome(mut self) -> Outcome {
        let (out, err) = self.readers.take().expect("collected once");
        Outcome {
            name: self.name.clone(),
            status: self.status,
            killed: self.killed,
            stdout: out.join().unwrap_or_default(),
            stderr: err.join().unwrap_or_default(),
        }
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        if self.status.is_none() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

fn drain(mut pipe: impl Read + Send + 'static) -> JoinHandle<String> {
    std::thread::spawn(move || {
        let mut bytes = Vec::new();
        let _ = pipe.read_to_end(&mut bytes);
        String::from_utf8_lossy(&bytes).into_owned()
    })
}

/// Waits for all children: each must exit within [`CHILD_LIMIT`]; once one
/// has failed the others get [`GRACE`], then whatever still runs is killed.
pub fn finish(mut children: Vec<Running>) -> Vec<Outcome> {
    let mut until = Instant::now() + CHILD_LIMIT;
    let mut why = "time limit";
    let mut failed = false;
    loop {
        let mut running = 0;
        for c in &mut children {
            if !c.exited() {
                running += 1;
            } else if !failed && !c.status.is_some_and(|s| s.success()) {
                failed = true;
                until = until.min(Instant::now() + GRACE);
                why = "still running after the other side failed";
            }
        }
        if running == 0 {
            break;
        }
        if Instant::now() >= until {
            children.iter_mut().for_each(|c| c.stop(why));
            break;
        }
        std::thread::sleep(POLL);
    }
    children.into_iter().map(Running::outcome).collect()
}

/// Panics with every side's output unless all exited 0; prints it anyway
/// (shown with `--nocapture`).
pub fn require_success(what: &str, outcomes: &[Outcome]) {
    let all: String = outcomes.iter().map(|o| o.to_string()).collect();
    println!("{what}:\n{all}");
    let bad: Vec<&str> = outcomes
        .iter()
        .filter(|o| !o.ok())
        .map(|o| o.name.as_str())
        .collect();
    assert!(bad.is_empty(), "{what}: {bad:?} failed\n{all}");
}

/// Panics (with every side's output) unless one line of `o`'s stdout
/// contains all of `needles`.
pub fn require_line(what: &str, o: &Outcome, needles: &[&str], all: &[Outcome]) {
    if !o
        .stdout
        .lines()
        .any(|l| needles.iter().all(|n| l.contains(n)))
    {
        let all: String = all.iter().map(|o| o.to_string()).collect();
        panic!(
            "{what}: {}'s stdout has no line containing all of {needles:?}\n{all}",
            o.name
        );
    }
}

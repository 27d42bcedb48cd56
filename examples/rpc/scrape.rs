//! `--metrics PORT`: a scrape endpoint, `GET /metrics` over HTTP/1.0
//! answered with metrics.rs's text, on a thread of its own. The poll loops
//! publish their counts into it every half second (never on the data
//! path). A front door like any other: one request per connection, at
//! most [`READ_LIMIT`] bytes read, read and answered within [`DEADLINE`],
//! one client at a time (a silent or slow one holds it at most that long),
//! anything but `GET /metrics` answered with an error status and closed.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::metrics::{hw_counters, hw_dir, render, ShardCounts};

/// The most of a request read: its request line and a few headers.
pub const READ_LIMIT: usize = 2048;

/// How long a client has to send its request, and then to take the answer.
pub const DEADLINE: Duration = Duration::from_secs(1);

/// What the poll loops publish and a scrape reads: one entry per shard.
#[derive(Clone)]
pub struct Published(Arc<Mutex<Vec<ShardCounts>>>);

impl Published {
    pub fn new(shards: usize) -> Published {
        Published(Arc::new(Mutex::new(vec![ShardCounts::default(); shards])))
    }

    /// Shard `i`'s counts as of now.
    pub fn publish(&self, i: usize, counts: &ShardCounts) {
        if let Ok(mut all) = self.0.lock() {
            if let Some(slot) = all.get_mut(i) {
                slot.clone_from(counts);
            }
        }
    }

    /// Every shard's counts summed.
    pub fn total(&self) -> ShardCounts {
        let mut sum = ShardCounts::default();
        for s in self.snapshot() {
            sum.add(&s);
        }
        sum
    }

    /// Each shard's connections, as it last published them.
    pub fn conns(&self) -> Vec<u64> {
        self.snapshot().iter().map(|s| s.conns).collect()
    }

    fn snapshot(&self) -> Vec<ShardCounts> {
        self.0.lock().map(|all| all.clone()).unwrap_or_default()
    }
}

/// Serves scrapes on `port` (all addresses) from a new thread, with
/// `device`'s port 1 hardware counters read at each scrape.
pub fn serve(port: u16, device: String, published: Published) -> std::io::Result<()> {
    let listener = TcpListener::bind(("0.0.0.0", port))?;
    println!("server: metrics on http://0.0.0.0:{port}/metrics");
    std::thread::Builder::new()
        .name("metrics".into())
        .spawn(move || {
            for stream in listener.incoming().flatten() {
                let body = || {
                    let hw = hw_counters(&hw_dir(&device, 1));
                    render(&published.snapshot(), &device, 1, &hw)
                };
                let _ = answer(stream, body);
            }
        })?;
    Ok(())
}

/// Reads one request from `stream` and answers it: `body()` for
/// `GET /metrics`, an error status for anything else; then closes.
pub fn answer(mut stream: TcpStream, body: impl FnOnce() -> String) -> std::io::Result<()> {
    let started = Instant::now();
    let mut buf = [0u8; READ_LIMIT];
    let mut got = 0;
    let complete = loop {
        if buf[..got].windows(4).any(|w| w == b"\r\n\r\n")
            || buf[..got].windows(2).any(|w| w == b"\n\n")
        {
            break true;
        }
        let left = DEADLINE.saturating_sub(started.elapsed());
        if got == READ_LIMIT || left.is_zero() {
            break false;
        }
        stream.set_read_timeout(Some(left))?;
        match stream.read(&mut buf[got..]) {
            Ok(0) | Err(_) => break false,
            Ok(n) => got += n,
        }
    };
    let line = std::str::from_utf8(&buf[..got])
        .ok()
        .and_then(|t| t.lines().next())
        .unwrap_or("");
    let mut words = line.split(' ');
    let (method, path, version) = (words.next(), words.next(), words.next());
    let (status, text) = match (complete, method, path, version) {
        (false, ..) => ("400 Bad Request", String::new()),
        (_, _, _, Some(v)) if !v.starts_with("HTTP/1.") => ("400 Bad Request", String::new()),
        (_, Some("GET"), Some("/metrics"), Some(_)) => ("200 OK", body()),
        (_, Some("GET"), Some(_), Some(_)) => ("404 Not Found", String::new()),
        (_, Some(_), Some(_), Some(_)) => ("405 Method Not Allowed", String::new()),
        _ => ("400 Bad Request", String::new()),
    };
    let head = format!(
        "HTTP/1.0 {status}\r\nContent-Type: text/plain; version=0.0.4; charset=utf-8\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        text.len()
    );
    // The whole answer by the same deadline: a client reading a byte at a
    // time holds the one metrics thread no longer than one that sends so.
    let answer = [head.as_bytes(), text.as_bytes()].concat();
    let mut sent = 0;
    while sent < answer.len() {
        let left = DEADLINE.saturating_sub(started.elapsed());
        if left.is_zero() {
            return Err(std::io::ErrorKind::TimedOut.into());
        }
        stream.set_write_timeout(Some(left))?;
        match stream.write(&answer[sent..])? {
            0 => return Err(std::io::ErrorKind::WriteZero.into()),
            n => sent += n,
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::Shutdown;

    /// What a client sending `request` (then closing its side) gets back,
    /// and whether the metrics were rendered for it.
    fn ask(request: &[u8]) -> (String, bool) {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let request = request.to_vec();
        let client = std::thread::spawn(move || {
            let mut s = TcpStream::connect(addr).unwrap();
            let _ = s.write_all(&request);
            let _ = s.shutdown(Shutdown::Write);
            let mut out = String::new();
            let _ = s.read_to_string(&mut out);
            out
        });
        let (stream, _) = listener.accept().unwrap();
        let mut rendered = false;
        let _ = answer(stream, || {
            rendered = true;
            "verbs_sends_posted_total{shard=\"0\"} 1\n".into()
        });
        (client.join().unwrap(), rendered)
    }

    #[test]
    fn answers_a_scrape_and_refuses_the_rest() {
        let (ok, rendered) = ask(b"GET /metrics HTTP/1.1\r\nHost: x\r\nAccept: */*\r\n\r\n");
        assert!(rendered);
        assert!(ok.starts_with("HTTP/1.0 200 OK\r\n"), "{ok}");
        assert!(
            ok.contains("Content-Type: text/plain; version=0.0.4"),
            "{ok}"
        );
        assert!(
            ok.ends_with("\r\n\r\nverbs_sends_posted_total{shard=\"0\"} 1\n"),
            "{ok}"
        );
        for (request, status) in [
            (&b"GET / HTTP/1.0\r\n\r\n"[..], "404"),
            (b"POST /metrics HTTP/1.0\r\n\r\n", "405"),
            (b"GET /metrics SPDY/3\r\n\r\n", "400"),
            (b"\x00\xff garbage\r\n\r\n", "400"),
            // Closed before the request ended, or nothing at all.
            (b"GET /metrics HTTP/1.0\r\n", "400"),
            (b"", "400"),
        ] {
            let (got, rendered) = ask(request);
            assert!(!rendered, "{request:?}");
            assert!(
                got.starts_with(&format!("HTTP/1.0 {status}")),
                "{request:?}: {got}"
            );
            assert!(!got.contains("verbs_sends_posted_total"), "{got}");
        }
    }

    #[test]
    fn a_request_over_the_read_limit_is_refused_unread() {
        let mut flood = b"GET /metrics HTTP/1.0\r\nX: ".to_vec();
        flood.resize(READ_LIMIT * 4, b'a');
        // The client may see the 400 or, its data unread, a reset.
        let (got, rendered) = ask(&flood);
        assert!(!rendered && !got.contains("200 OK"), "{got}");
    }
}

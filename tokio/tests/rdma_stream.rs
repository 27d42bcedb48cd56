//! RdmaStream on a device (both ends in one guest, over rxe0): bytes
//! arrive whole and in order whatever the write sizes, a full receive
//! ring pushes back, a half-close reads as EOF, a dead peer is an error,
//! many accepts run at once, and a token keeps strangers out.

mod support;

use std::net::SocketAddr;
use std::task::Poll;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWrite, AsyncWriteExt};
use verbs::exchange::Token;
use verbs::{ConnectOptions, ProtectionDomain};
use verbs_tokio::{ListenerConfig, RdmaListener, RdmaStream, StreamConfig};

use support::{or_hang, pattern};

async fn listener(pd: &ProtectionDomain, stream: StreamConfig) -> RdmaListener {
    let config = ListenerConfig {
        stream,
        ..ListenerConfig::default()
    };
    let any: SocketAddr = "127.0.0.1:0".parse().unwrap();
    RdmaListener::bind_with(pd, any, config, |peer, e| eprintln!("rejected {peer}: {e}"))
        .await
        .unwrap()
}

/// A connected pair: (client side, server side).
async fn pair(pd: &ProtectionDomain, config: StreamConfig) -> (RdmaStream, RdmaStream) {
    let l = listener(pd, config.clone()).await;
    let addr = l.local_addr();
    let (client, server) = tokio::join!(RdmaStream::connect_with(pd, addr, &config), l.accept());
    (client.unwrap(), server.unwrap().0)
}

#[tokio::test]
async fn bytes_arrive_whole_and_in_order_and_a_half_close_reads_as_eof() {
    let pd = support::test_pd("stream_echo");
    let (mut client, mut server) = pair(&pd, StreamConfig::default()).await;
    // 1 MiB + 3: many slots, a ring refilled many times, a short last one.
    let sent = pattern(1, (1 << 20) + 3);
    let echo = tokio::spawn(async move {
        let mut got = Vec::new();
        server.read_to_end(&mut got).await.unwrap(); // until the client's shutdown
        server.write_all(&got).await.unwrap();
        server.shutdown().await.unwrap();
        got.len()
    });
    let writer = async {
        // Odd sizes, one byte to more than a slot.
        let mut at = 0;
        for size in [1usize, 7, 16 << 10, (16 << 10) + 1, 100_000]
            .iter()
            .cycle()
        {
            let end = (at + size).min(sent.len());
            client.write_all(&sent[at..end]).await.unwrap();
            at = end;
            if at == sent.len() {
                break;
            }
        }
        client.shutdown().await.unwrap();
        let mut back = Vec::new();
        client.read_to_end(&mut back).await.unwrap();
        back
    };
    let back = or_hang("echo of 1 MiB", writer).await;
    assert_eq!(or_hang("echo server", echo).await.unwrap(), sent.len());
    assert!(back == sent, "the echo is byte for byte what was sent");
    // EOF stays EOF; writing after shutdown is an error.
    let mut more = [0u8; 8];
    assert_eq!(client.read(&mut more).await.unwrap(), 0);
    assert!(client.write(b"late").await.is_err());
}

#[tokio::test]
async fn a_full_receive_ring_pushes_back_until_the_reader_reads() {
    let pd = support::test_pd("stream_back_pressure");
    let config = StreamConfig {
        slot_size: 1024,
        recv_slots: 4,
        send_slots: 8,
        ..StreamConfig::default()
    };
    let (mut client, mut server) = pair(&pd, config).await;
    let chunk = pattern(2, 1024);
    let mut accepted = 0;
    // Write until the writer is refused: exactly the reader's 4 slots.
    or_hang("fill the ring", async {
        loop {
            let polled = std::future::poll_fn(|cx| {
                Poll::Ready(std::pin::Pin::new(&mut client).poll_write(cx, &chunk))
            })
            .await;
            match polled {
                Poll::Ready(n) => accepted += n.unwrap(),
                // Pending with credits left only while sends complete.
                Poll::Pending if accepted >= 4 * 1024 => break,
                Poll::Pending => tokio::task::yield_now().await,
            }
        }
    })
    .await;
    assert_eq!(accepted, 4 * 1024, "no more than the reader's ring holds");
    // The reader reads: the credits come back and the writer goes on.
    let mut got = vec![0u8; 8 * 1024];
    let reader = async {
        server.read_exact(&mut got).await.unwrap();
    };
    let writer = async {
        client.write_all(&pattern(2, 4 * 1024)[..]).await.unwrap();
        client.flush().await.unwrap();
    };
    or_hang("drain and refill", async { tokio::join!(reader, writer) }).await;
    assert_eq!(&got[..1024], &chunk[..]);
}

#[tokio::test]
async fn a_dead_peer_is_an_error_for_a_reader_and_a_writer_not_a_hang() {
    let pd = support::test_pd("stream_dead_peer");
    let config = StreamConfig {
        keepalive: Some(Duration::from_millis(200)),
        connect: ConnectOptions {
            timeout: 14,
            retry_cnt: 2,
            ..ConnectOptions::default()
        },
        ..StreamConfig::default()
    };
    let (mut client, server) = pair(&pd, config.clone()).await;
    drop(server); // its queue pair is destroyed: nothing answers
    let mut buf = [0u8; 16];
    let e = or_hang("read from a dead peer", client.read(&mut buf))
        .await
        .expect_err("a peer that is gone is an error");
    assert_eq!(e.kind(), std::io::ErrorKind::ConnectionReset, "{e}");
    assert!(e.to_string().contains("keepalive probe"), "{e}");
    // A writer with credits left finds out from its own sends.
    let (mut client, server) = pair(&pd, config).await;
    drop(server);
    let e = or_hang("write to a dead peer", async {
        loop {
            client.write_all(&[7u8; 4096]).await?;
            client.flush().await?;
        }
        #[allow(unreachable_code)]
        Ok::<(), std::io::Error>(())
    })
    .await
    .expect_err("a peer that is gone is an error");
    assert_eq!(e.kind(), std::io::ErrorKind::ConnectionReset, "{e}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_accepts_at_once_each_get_one_client() {
    let pd = support::test_pd("stream_many_accepts");
    let config = StreamConfig {
        slot_size: 4096,
        recv_slots: 4,
        send_slots: 4,
        ..StreamConfig::default()
    };
    let l = std::sync::Arc::new(listener(&pd, config.clone()).await);
    let addr = l.local_addr();
    const N: u64 = 12;
    let servers: Vec<_> = (0..N)
        .map(|_| {
            let l = l.clone();
            tokio::spawn(async move {
                let (mut s, _) = l.accept().await.unwrap();
                let mut n = [0u8; 8];
                s.read_exact(&mut n).await.unwrap();
                s.write_all(&n).await.unwrap();
                s.shutdown().await.unwrap();
                u64::from_le_bytes(n)
            })
        })
        .collect();
    let clients: Vec<_> = (0..N)
        .map(|i| {
            let (pd, config) = (pd.clone(), config.clone());
            tokio::spawn(async move {
                let mut c = RdmaStream::connect_with(&pd, addr, &config).await.unwrap();
                c.write_all(&i.to_le_bytes()).await.unwrap();
                let mut back = Vec::new();
                c.read_to_end(&mut back).await.unwrap();
                assert_eq!(back, i.to_le_bytes(), "client {i} got its own echo");
            })
        })
        .collect();
    let mut served = Vec::new();
    for s in servers {
        served.push(or_hang("an accept", s).await.unwrap());
    }
    for c in clients {
        or_hang("a client", c).await.unwrap();
    }
    served.sort_unstable();
    assert_eq!(
        served,
        (0..N).collect::<Vec<_>>(),
        "each client accepted once"
    );
}

#[tokio::test]
async fn a_listener_with_a_token_serves_only_clients_that_present_it() {
    let pd = support::test_pd("stream_token");
    let token = Token::new(b"open sesame").unwrap();
    let config = StreamConfig {
        token: Some(token),
        ..StreamConfig::default()
    };
    let l = listener(&pd, config.clone()).await;
    let addr = l.local_addr();
    let stranger = StreamConfig {
        token: None,
        setup_timeout: Duration::from_secs(20),
        ..StreamConfig::default()
    };
    let refused = RdmaStream::connect_with(&pd, addr, &stranger).await;
    assert!(refused.is_err(), "no token, no stream");
    let (client, server) = tokio::join!(RdmaStream::connect_with(&pd, addr, &config), l.accept());
    let (mut client, (mut server, _)) = (client.unwrap(), server.unwrap());
    client.write_all(b"hi").await.unwrap();
    let mut two = [0u8; 2];
    server.read_exact(&mut two).await.unwrap();
    assert_eq!(&two, b"hi");
}

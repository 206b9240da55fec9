//! A loopback TCP relay in front of Redis that counts round trips, which Redis itself does not:
//! a round trip begins when a client sends a request while every earlier request of that
//! connection has been answered. A pipeline is thus one round trip however many commands it
//! holds, and a client that waits for each reply makes one per command.
//!
//! It counts complete RESP frames in both directions to know what is outstanding.

use std::net::{Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

pub struct RoundTripRelay {
    addr: SocketAddr,
    round_trips: Arc<AtomicU64>,
}

impl RoundTripRelay {
    /// Listens on a free loopback port and relays every connection to `upstream`.
    pub async fn start(upstream: SocketAddr) -> Self {
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
            .await
            .expect("relay port");
        let addr = listener.local_addr().expect("relay address");
        let round_trips = Arc::new(AtomicU64::new(0));
        let counter = round_trips.clone();
        tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let server = TcpStream::connect(upstream).await.expect("relay upstream");
                tokio::spawn(relay(client, server, counter.clone()));
            }
        });
        Self { addr, round_trips }
    }

    pub fn url(&self) -> String {
        format!("redis://{}", self.addr)
    }

    /// Round trips over every connection so far.
    pub fn round_trips(&self) -> u64 {
        self.round_trips.load(Ordering::Relaxed)
    }
}

async fn relay(client: TcpStream, server: TcpStream, round_trips: Arc<AtomicU64>) {
    let (mut client_read, mut client_write) = client.into_split();
    let (mut server_read, mut server_write) = server.into_split();
    let requests = Arc::new(AtomicU64::new(0));
    let replies = Arc::new(AtomicU64::new(0));
    let answered = replies.clone();
    let asked = requests.clone();
    let upstream = async move {
        let mut frames = Frames::default();
        let mut chunk = vec![0; 64 * 1024];
        while let Ok(n @ 1..) = client_read.read(&mut chunk).await {
            let all_answered = answered.load(Ordering::Acquire) >= asked.load(Ordering::Acquire);
            if frames.at_boundary() && all_answered {
                round_trips.fetch_add(1, Ordering::Relaxed);
            }
            asked.fetch_add(frames.feed(&chunk[..n]), Ordering::Release);
            if server_write.write_all(&chunk[..n]).await.is_err() {
                break;
            }
        }
    };
    let downstream = async move {
        let mut frames = Frames::default();
        let mut chunk = vec![0; 64 * 1024];
        while let Ok(n @ 1..) = server_read.read(&mut chunk).await {
            replies.fetch_add(frames.feed(&chunk[..n]), Ordering::Release);
            if client_write.write_all(&chunk[..n]).await.is_err() {
                break;
            }
        }
    };
    tokio::join!(upstream, downstream);
}

/// Counts complete RESP2 frames in a byte stream that arrives in arbitrary chunks.
#[derive(Default)]
struct Frames {
    pending: Vec<u8>,
}

impl Frames {
    /// Whether no frame is partly received.
    fn at_boundary(&self) -> bool {
        self.pending.is_empty()
    }

    /// Takes in `bytes`; returns how many frames they completed.
    fn feed(&mut self, bytes: &[u8]) -> u64 {
        self.pending.extend_from_slice(bytes);
        let mut complete = 0;
        let mut at = 0;
        while let Some(len) = frame_len(&self.pending[at..]) {
            at += len;
            complete += 1;
        }
        self.pending.drain(..at);
        complete
    }
}

/// The length of the complete frame at the start of `bytes`, if it is all there.
fn frame_len(bytes: &[u8]) -> Option<usize> {
    let cr = bytes.windows(2).position(|w| w == b"\r\n")?;
    let after_header = cr + 2;
    let count = || std::str::from_utf8(&bytes[1..cr]).ok()?.parse::<i64>().ok();
    match bytes[0] {
        b'$' => match usize::try_from(count()?) {
            Ok(len) => {
                let end = after_header + len + 2;
                (bytes.len() >= end).then_some(end)
            }
            Err(_) => Some(after_header), // a nil bulk
        },
        b'*' => {
            let mut at = after_header;
            for _ in 0..count()?.max(0) {
                at += frame_len(&bytes[at..])?;
            }
            Some(at)
        }
        // Simple strings, errors, integers (and inline commands, which no client here sends).
        _ => Some(after_header),
    }
}

//! A TCP proxy in front of a server that can delay, swallow or blackhole traffic on command.

use std::io;
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;
use tokio::time::Instant;

/// What a [`FaultProxy`] does with the bytes it reads. Each chunk is judged when it is read, so
/// a change applies at once to every open connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Fault {
    /// Forward everything as it comes.
    #[default]
    Pass,
    /// Forward each chunk, in both directions, this long after it was read: added latency, with
    /// pipelined requests still overlapping as on a slow link.
    Delay(Duration),
    /// Forward requests to the server but swallow its replies: the commands take effect while the
    /// client hears nothing, as when the return path fails.
    DropReplies,
    /// Read both directions and forward nothing; connections stay open, as in a network partition
    /// that loses packets without resetting anything. Bytes swallowed here are lost for good, so a
    /// connection that lived through a blackhole may be out of step with the server after
    /// [`FaultProxy::heal`]; new connections are clean.
    Blackhole,
    /// [`Blackhole`](Self::Blackhole) on the connections that have sent a `SUBSCRIBE` or an
    /// `UNSUBSCRIBE` (a client's release subscription), [`Pass`](Self::Pass) on the others: the
    /// subscription is cut off while the client's commands go through.
    BlackholeSubscribers,
}

/// A TCP proxy from a free loopback port to an upstream address, whose behaviour tests switch at
/// run time with [`set`](Self::set) and [`reset_all`](Self::reset_all).
///
/// Its tasks run on the tokio runtime that called [`start`](Self::start). Dropping it stops
/// accepting and closes every connection.
#[derive(Debug)]
pub struct FaultProxy {
    addr: SocketAddr,
    fault: watch::Sender<Fault>,
    /// Bumped to make every current connection close; connections opened later do not see past
    /// bumps. Dropping the sender closes them all too.
    resets: watch::Sender<u64>,
    connections: Arc<AtomicUsize>,
    accepted: Arc<AtomicUsize>,
    acceptor: JoinHandle<()>,
}

impl FaultProxy {
    /// Listens on a free loopback port and forwards every connection to `upstream`, in
    /// [`Fault::Pass`] mode.
    ///
    /// # Panics
    ///
    /// If no loopback port can be bound, or when called outside a tokio runtime.
    pub async fn start(upstream: SocketAddr) -> Self {
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
            .await
            .unwrap_or_else(|err| panic!("fault proxy cannot bind a loopback port: {err}"));
        let addr = listener
            .local_addr()
            .expect("a bound listener has an address");
        let (fault, _) = watch::channel(Fault::Pass);
        let (resets, _) = watch::channel(0);
        let connections = Arc::new(AtomicUsize::new(0));
        let accepted = Arc::new(AtomicUsize::new(0));
        let acceptor = tokio::spawn(accept_loop(
            listener,
            upstream,
            fault.clone(),
            resets.clone(),
            (connections.clone(), accepted.clone()),
        ));
        FaultProxy {
            addr,
            fault,
            resets,
            connections,
            accepted,
            acceptor,
        }
    }

    /// The address clients should connect to.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The proxy's URL, `redis://127.0.0.1:port`, to hand to a client instead of the server's.
    pub fn url(&self) -> String {
        format!("redis://{}", self.addr)
    }

    /// Switches to `fault`, for open and future connections alike.
    pub fn set(&self, fault: Fault) {
        self.fault.send_replace(fault);
    }

    /// Goes back to [`Fault::Pass`].
    pub fn heal(&self) {
        self.set(Fault::Pass);
    }

    /// Closes every open connection, with a TCP reset on both sides, as when a server crashes or
    /// a middlebox drops its state. New connections are accepted as before.
    pub fn reset_all(&self) {
        self.resets.send_modify(|epoch| *epoch += 1);
    }

    /// How many client connections are open right now. Closing is asynchronous: after
    /// [`reset_all`](Self::reset_all) the count falls to zero shortly, not at once.
    pub fn connections(&self) -> usize {
        self.connections.load(Ordering::SeqCst)
    }

    /// How many connections it has accepted so far: the client's connection attempts, including
    /// those it closed at once because the upstream was unreachable.
    pub fn accepted(&self) -> usize {
        self.accepted.load(Ordering::SeqCst)
    }
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        // Dropping the listener stops accepting; dropping `self.resets` right after closes the
        // open connections, whose tasks treat a closed channel as a reset.
        self.acceptor.abort();
    }
}

async fn accept_loop(
    listener: TcpListener,
    upstream: SocketAddr,
    fault: watch::Sender<Fault>,
    resets: watch::Sender<u64>,
    (connections, accepted): (Arc<AtomicUsize>, Arc<AtomicUsize>),
) {
    loop {
        let Ok((client, _)) = listener.accept().await else {
            // Out of file descriptors or similar: back off instead of spinning.
            tokio::time::sleep(Duration::from_millis(10)).await;
            continue;
        };
        accepted.fetch_add(1, Ordering::SeqCst);
        let open = OpenConnection::count(&connections);
        let fault = fault.subscribe();
        let reset = resets.subscribe();
        tokio::spawn(async move {
            serve(client, upstream, fault, reset).await;
            drop(open);
        });
    }
}

/// Counts a connection as open for as long as it lives, however its task ends.
struct OpenConnection(Arc<AtomicUsize>);

impl OpenConnection {
    fn count(connections: &Arc<AtomicUsize>) -> Self {
        connections.fetch_add(1, Ordering::SeqCst);
        OpenConnection(connections.clone())
    }
}

impl Drop for OpenConnection {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Which way a chunk travels; [`Fault::DropReplies`] treats the two differently.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Direction {
    ToServer,
    ToClient,
}

async fn serve(
    mut client: TcpStream,
    upstream: SocketAddr,
    fault: watch::Receiver<Fault>,
    mut reset: watch::Receiver<u64>,
) {
    // An unreachable upstream shows to the client as a connection closed at once.
    let Ok(mut server) = TcpStream::connect(upstream).await else {
        return;
    };
    let _ = client.set_nodelay(true);
    let _ = server.set_nodelay(true);
    let was_reset = {
        let (from_client, to_client) = client.split();
        let (from_server, to_server) = server.split();
        let subscriber = AtomicBool::new(false);
        let forward = async {
            tokio::try_join!(
                pump(
                    from_client,
                    to_server,
                    Direction::ToServer,
                    fault.clone(),
                    &subscriber
                ),
                pump(
                    from_server,
                    to_client,
                    Direction::ToClient,
                    fault,
                    &subscriber
                ),
            )
        };
        tokio::select! {
            _ = forward => false,
            _ = reset.changed() => true,
        }
    };
    if was_reset {
        // Zero linger turns the close into a reset, which a client sees at once as an error
        // rather than as an orderly end of stream.
        let _ = client.set_zero_linger();
        let _ = server.set_zero_linger();
    }
}

/// Copies one direction until end of stream, then passes the end on (a half close), applying the
/// current fault to each chunk. `subscriber` is set once the client sent a (un)subscribe.
async fn pump(
    mut from: impl AsyncReadExt + Unpin,
    mut to: impl AsyncWriteExt + Unpin,
    direction: Direction,
    fault: watch::Receiver<Fault>,
    subscriber: &AtomicBool,
) -> io::Result<()> {
    // Reading and writing run apart so a delay holds back each chunk by the same amount without
    // holding back the reading of the next one.
    let (queue, mut queued) = mpsc::unbounded_channel::<(Instant, Vec<u8>)>();
    let read = async move {
        let mut buf = vec![0; 16 * 1024];
        loop {
            let n = from.read(&mut buf).await?;
            if n == 0 {
                return Ok::<_, io::Error>(());
            }
            if direction == Direction::ToServer && subscribes(&buf[..n]) {
                subscriber.store(true, Ordering::SeqCst);
            }
            let due = match *fault.borrow() {
                Fault::Pass => Instant::now(),
                Fault::Delay(delay) => Instant::now() + delay,
                Fault::DropReplies if direction == Direction::ToServer => Instant::now(),
                Fault::BlackholeSubscribers if !subscriber.load(Ordering::SeqCst) => Instant::now(),
                Fault::DropReplies | Fault::Blackhole | Fault::BlackholeSubscribers => continue,
            };
            // The writer only stops on an error, which ends this connection anyway.
            let _ = queue.send((due, buf[..n].to_vec()));
        }
    };
    let write = async move {
        while let Some((due, chunk)) = queued.recv().await {
            tokio::time::sleep_until(due).await;
            to.write_all(&chunk).await?;
        }
        to.shutdown().await
    };
    tokio::try_join!(read, write).map(|_| ())
}

/// Whether a chunk a client sent holds a `SUBSCRIBE` or `UNSUBSCRIBE` (sharded or by pattern too).
fn subscribes(chunk: &[u8]) -> bool {
    chunk
        .windows(b"SUBSCRIBE".len())
        .any(|word| word.eq_ignore_ascii_case(b"SUBSCRIBE"))
}

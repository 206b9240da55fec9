//! A real `redis-server` child process per test, on a free loopback port.

use std::fs::{self, OpenOptions};
use std::io::{self, Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{OnceLock, mpsc};
use std::thread;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use redis::ConnectionLike;

/// How long a start or restart may take before the test is failed.
const READY_BUDGET: Duration = Duration::from_secs(10);
/// How many fresh ports to try: a port found free can be taken by someone else before redis binds it.
const START_ATTEMPTS: usize = 5;
/// Bounds [`RedisServer::command`] so a paused server fails the test instead of hanging it; long
/// enough for a `DEBUG SLEEP` of a few seconds.
const COMMAND_TIMEOUT: Duration = Duration::from_secs(30);
/// Bounds connection set-up in [`RedisServer::connection`].
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// A `redis-server` child process listening on `127.0.0.1` at a port of its own.
///
/// Nothing is persisted (`--save ""`, `--appendonly no`, a fresh working directory) and `DEBUG`
/// is enabled for local clients, so tests can use `DEBUG SLEEP`. The process is killed and its
/// directory removed on drop, and it is also killed if the test process dies without dropping it
/// (Linux parent-death signal), so no server outlives its test.
#[derive(Debug)]
pub struct RedisServer {
    port: u16,
    extra_args: Vec<String>,
    /// A configuration file written into `dir` and named first on the command line (a
    /// sentinel needs one it can rewrite).
    config: Option<String>,
    dir: PathBuf,
    child: Option<Child>,
    /// A cluster node's bus port, picked free like `port` (the default, `port + 10000`, may be
    /// taken or above 65535).
    bus_port: Option<u16>,
}

/// Why one attempt to bring the server up failed.
enum StartFailure {
    /// The process exited, most often because the port was taken.
    Exited,
    /// The process runs but did not answer `PING` in time.
    TimedOut,
}

impl RedisServer {
    /// Starts a server with the default arguments and waits until it answers `PING`.
    ///
    /// # Panics
    ///
    /// If `redis-server` cannot be found or does not come up within 10 s.
    pub fn start() -> Self {
        Self::start_with(&[])
    }

    /// Starts a server with `extra_args` appended to the defaults (so they override them), e.g.
    /// `&["--maxmemory", "1mb"]`, and waits until it answers `PING`.
    ///
    /// # Panics
    ///
    /// If `redis-server` cannot be found, rejects the arguments, or does not come up within 10 s.
    /// The message includes the server's output.
    pub fn start_with(extra_args: &[&str]) -> Self {
        Self::start_configured(None, extra_args)
    }

    /// Starts a Redis Sentinel whose configuration file holds `config` (e.g. its `sentinel
    /// monitor` lines), and waits until it answers `PING`.
    ///
    /// # Panics
    ///
    /// As [`start_with`](Self::start_with).
    pub fn start_sentinel(config: &str) -> Self {
        Self::start_configured(Some(config.to_owned()), &["--sentinel"])
    }

    fn start_configured(config: Option<String>, extra_args: &[&str]) -> Self {
        let mut server = RedisServer {
            port: 0,
            extra_args: extra_args.iter().map(|arg| arg.to_string()).collect(),
            config,
            dir: fresh_dir(),
            child: None,
            bus_port: None,
        };
        let clustered = extra_args.contains(&"--cluster-enabled");
        for _ in 0..START_ATTEMPTS {
            server.port = free_port();
            server.bus_port = clustered.then(free_port);
            match server.spawn_and_wait(Instant::now() + READY_BUDGET) {
                Ok(()) => return server,
                Err(StartFailure::Exited) => continue,
                Err(StartFailure::TimedOut) => server.fail("did not answer PING within 10 s"),
            }
        }
        server.fail(&format!("exited at start {START_ATTEMPTS} times"))
    }

    /// A cluster node's bus port (set for servers started with `--cluster-enabled`).
    pub fn bus_port(&self) -> Option<u16> {
        self.bus_port
    }

    /// The port the server listens on; it stays the same across [`restart`](Self::restart).
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The server's socket address, `127.0.0.1:port`.
    pub fn addr(&self) -> SocketAddr {
        SocketAddr::from((Ipv4Addr::LOCALHOST, self.port))
    }

    /// The server's URL, `redis://127.0.0.1:port`.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// Whether the server process runs (it was not [`kill`](Self::kill)ed, or was restarted).
    pub fn is_running(&self) -> bool {
        self.child.is_some()
    }

    /// The process id of the running server.
    ///
    /// # Panics
    ///
    /// If the server has been [`kill`](Self::kill)ed and not restarted.
    pub fn pid(&self) -> u32 {
        self.running().id()
    }

    /// Kills the server with `SIGKILL` and reaps it, as a crash would. Does nothing if it is not
    /// running.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            // Errors mean the process is already gone, which is what we want.
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Kills the server if it runs, then starts a new one on the same port (retrying while the
    /// port is still held, as after a crash) and waits until it answers `PING`. The data is gone,
    /// as after a crash of a server without persistence.
    ///
    /// # Panics
    ///
    /// If the server is not back within 10 s.
    pub fn restart(&mut self) {
        self.kill();
        // A replica that loads its sync from disk keeps it as `dump.rdb` and would come back
        // with it, to a partial resync: the data would not be gone.
        let _ = fs::remove_file(self.dir.join("dump.rdb"));
        let deadline = Instant::now() + READY_BUDGET;
        loop {
            match self.spawn_and_wait(deadline) {
                Ok(()) => return,
                Err(StartFailure::Exited) if Instant::now() < deadline => {
                    thread::sleep(Duration::from_millis(50));
                }
                Err(_) => self.fail("did not restart on its port within 10 s"),
            }
        }
    }

    /// Freezes the server with `SIGSTOP`: connections stay open and new ones are accepted by the
    /// kernel, but nothing is answered, as with a long GC pause or a stalled VM.
    ///
    /// # Panics
    ///
    /// If the server is not running.
    pub fn pause(&self) {
        self.signal(libc::SIGSTOP);
    }

    /// Lets a [`pause`](Self::pause)d server run again with `SIGCONT`.
    ///
    /// # Panics
    ///
    /// If the server is not running.
    pub fn resume(&self) {
        self.signal(libc::SIGCONT);
    }

    /// Cuts this replica off from its `master`, as a partition between the two would: it answers
    /// everyone else (so sentinels or the cluster may still promote it) but cannot sync, so the
    /// writes the master takes meanwhile reach no replica. Its link is broken and its login
    /// refused (a wrong `masterauth`) until the returned guard is dropped.
    ///
    /// # Panics
    ///
    /// If either server refuses, or the master had no replica link to cut.
    pub fn cut_off_from(&self, master: &RedisServer) -> ReplicaCut<'_> {
        expect_ok(self.command(&["CONFIG", "SET", "masterauth", "cut-off"]));
        let cut = master.command(&["CLIENT", "KILL", "TYPE", "replica"]);
        assert!(
            matches!(cut, redis::Value::Int(1..)),
            "the master had no replica link to cut: {cut:?}"
        );
        ReplicaCut { replica: self }
    }

    /// Opens a redis-rs connection to the server on the caller's runtime, for assertions on what
    /// the code under test left in Redis.
    ///
    /// # Panics
    ///
    /// If the connection cannot be established within 5 s.
    pub async fn connection(&self) -> redis::aio::MultiplexedConnection {
        let config =
            redis::AsyncConnectionConfig::new().set_connection_timeout(Some(CONNECT_TIMEOUT));
        self.client()
            .get_multiplexed_async_connection_with_config(&config)
            .await
            .unwrap_or_else(|err| panic!("cannot connect to redis-server at {}: {err}", self.url()))
    }

    /// Runs one command on a fresh blocking connection and returns the raw reply, so it can be
    /// used from any thread, with or without a runtime: `server.command(&["GET", "key"])`,
    /// `server.command(&["CLIENT", "PAUSE", "500"])`. An error reply comes back as
    /// [`redis::Value::ServerError`] rather than a panic, so tests can assert on it.
    ///
    /// # Panics
    ///
    /// If `args` is empty, or the connection fails or no reply comes within 30 s.
    pub fn command(&self, args: &[&str]) -> redis::Value {
        self.try_command(args).unwrap_or_else(|err| {
            panic!(
                "`{}` on redis-server at {} failed: {err}",
                args.join(" "),
                self.url()
            )
        })
    }

    /// [`command`](Self::command) with the connection's failure returned rather than a panic,
    /// for polls that run while the server may drop its clients (Sentinel sends `CLIENT KILL
    /// TYPE normal` to every node it reconfigures).
    ///
    /// # Panics
    ///
    /// If `args` is empty.
    pub fn try_command(&self, args: &[&str]) -> redis::RedisResult<redis::Value> {
        let (name, rest) = args
            .split_first()
            .expect("command needs at least a command name");
        let mut command = redis::cmd(name);
        for arg in rest {
            command.arg(*arg);
        }
        let mut connection = self.client().get_connection_with_timeout(COMMAND_TIMEOUT)?;
        connection.set_read_timeout(Some(COMMAND_TIMEOUT))?;
        connection.set_write_timeout(Some(COMMAND_TIMEOUT))?;
        connection.req_command(&command)
    }

    fn client(&self) -> redis::Client {
        redis::Client::open(self.url()).expect("a redis:// URL built from a port is valid")
    }

    fn running(&self) -> &Child {
        self.child
            .as_ref()
            .unwrap_or_else(|| panic!("redis-server on port {} is not running", self.port))
    }

    fn signal(&self, signal: libc::c_int) {
        send_signal(self.running(), signal)
            .unwrap_or_else(|err| panic!("cannot signal redis-server (pid {}): {err}", self.pid()));
    }

    /// Spawns the process on `self.port` and waits for `PING` until `deadline`. On failure the
    /// process is gone (exited, or killed here) and `self.child` is `None`.
    fn spawn_and_wait(&mut self, deadline: Instant) -> Result<(), StartFailure> {
        let child = spawn_orphan_proof(self.command_line())
            .unwrap_or_else(|err| panic!("cannot start {}: {err}", redis_server_bin().display()));
        let addr = self.addr();
        let child = self.child.insert(child);
        loop {
            // Checked on every round, so that a server that lost the race for the port is never
            // mistaken for whoever won it and answers PING there.
            if !matches!(child.try_wait(), Ok(None)) {
                self.child = None;
                return Err(StartFailure::Exited);
            }
            // The answer must come from our process: one that lost the race for the port lives
            // on for a moment while whoever won answers there.
            if answers_ping(addr) && process_id(addr) == Some(child.id()) {
                return Ok(());
            }
            if Instant::now() >= deadline {
                self.kill();
                return Err(StartFailure::TimedOut);
            }
            thread::sleep(Duration::from_millis(20));
        }
    }

    fn command_line(&self) -> Command {
        let log = OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.log_path())
            .unwrap_or_else(|err| panic!("cannot create {}: {err}", self.log_path().display()));
        let mut command = Command::new(redis_server_bin());
        if let Some(config) = &self.config {
            let path = self.dir.join("redis.conf");
            fs::write(&path, config)
                .unwrap_or_else(|err| panic!("cannot write {}: {err}", path.display()));
            command.arg(path);
        }
        if let Some(bus_port) = self.bus_port {
            command.arg("--cluster-port").arg(bus_port.to_string());
        }
        command
            .arg("--port")
            .arg(self.port.to_string())
            .args([
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
                "--dir",
            ])
            .arg(&self.dir)
            .args(["--enable-debug-command", "local", "--loglevel", "warning"])
            .args(&self.extra_args)
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("a log file handle can be cloned"))
            .stderr(log);
        command
    }

    fn log_path(&self) -> PathBuf {
        self.dir.join("redis-server.log")
    }

    fn fail(&mut self, what: &str) -> ! {
        self.kill();
        let log = fs::read_to_string(self.log_path()).unwrap_or_default();
        panic!(
            "redis-server on port {} {what}; its output:\n{log}",
            self.port
        )
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        if let Some(child) = &self.child {
            // SIGKILL ends a stopped process too; SIGCONT first keeps its exit ordinary.
            let _ = send_signal(child, libc::SIGCONT);
        }
        self.kill();
        let _ = fs::remove_dir_all(&self.dir);
    }
}

fn send_signal(child: &Child, signal: libc::c_int) -> io::Result<()> {
    let pid = libc::pid_t::try_from(child.id()).map_err(io::Error::other)?;
    // SAFETY: kill(2) has no memory-safety preconditions; the pid is our own unreaped child,
    // so it cannot have been recycled for another process.
    if unsafe { libc::kill(pid, signal) } == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// `$REDIS_SERVER_BIN`, else `redis-server` from `PATH`.
fn redis_server_bin() -> PathBuf {
    if let Some(bin) = std::env::var_os("REDIS_SERVER_BIN") {
        return PathBuf::from(bin);
    }
    let on_path = std::env::var_os("PATH").and_then(|path| {
        std::env::split_paths(&path)
            .map(|dir| dir.join("redis-server"))
            .find(|candidate| is_executable(candidate))
    });
    on_path
        .unwrap_or_else(|| panic!("redis-server not found: run scripts/test.sh, which installs it"))
}

fn is_executable(path: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    fs::metadata(path).is_ok_and(|meta| meta.is_file() && meta.permissions().mode() & 0o111 != 0)
}

/// A port the kernel just handed out, released for redis to bind. Another process may take it in
/// between; [`RedisServer::start_with`] then retries with a new one.
fn free_port() -> u16 {
    TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
        .and_then(|listener| listener.local_addr())
        .map(|addr| addr.port())
        .unwrap_or_else(|err| panic!("cannot find a free loopback port: {err}"))
}

/// A new, empty directory for one server's files.
fn fresh_dir() -> PathBuf {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    let name = format!(
        "lockmacro-testkit-{}-{}-{nanos}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    );
    let dir = std::env::temp_dir().join(name);
    fs::create_dir_all(&dir).unwrap_or_else(|err| panic!("cannot create {}: {err}", dir.display()));
    dir
}

/// Whether something at `addr` answers a RESP `PING` with `+PONG` (not `-LOADING`) right now.
fn answers_ping(addr: SocketAddr) -> bool {
    let attempt = || -> io::Result<bool> {
        let budget = Duration::from_millis(500);
        let mut stream = TcpStream::connect_timeout(&addr, budget)?;
        stream.set_read_timeout(Some(budget))?;
        stream.set_write_timeout(Some(budget))?;
        stream.write_all(b"PING\r\n")?;
        let mut reply = [0; 5];
        stream.read_exact(&mut reply)?;
        Ok(&reply == b"+PONG")
    };
    attempt().unwrap_or(false)
}

/// The `process_id` the server at `addr` reports in `INFO server`.
fn process_id(addr: SocketAddr) -> Option<u32> {
    let attempt = || -> io::Result<Option<u32>> {
        let budget = Duration::from_millis(500);
        let mut stream = TcpStream::connect_timeout(&addr, budget)?;
        stream.set_read_timeout(Some(budget))?;
        stream.write_all(b"INFO server\r\n")?;
        let mut reply = Vec::new();
        let mut chunk = [0; 4096];
        loop {
            let read = stream.read(&mut chunk)?;
            if read == 0 {
                return Ok(None);
            }
            reply.extend_from_slice(&chunk[..read]);
            let text = String::from_utf8_lossy(&reply);
            if let Some(rest) = text.split("process_id:").nth(1)
                && let Some((pid, _)) = rest.split_once("\r\n")
            {
                return Ok(pid.trim().parse().ok());
            }
        }
    };
    attempt().ok().flatten()
}

/// Spawns `command` so that the child is killed when the test process dies, even by `SIGKILL`
/// (a nextest timeout), where no `Drop` runs.
///
/// Linux delivers the parent-death signal when the *thread* that forked exits, so the fork happens
/// on one thread that lives as long as the process: forking from, say, a `spawn_blocking` worker
/// would kill the server when that worker idles out.
fn spawn_orphan_proof(mut command: Command) -> io::Result<Child> {
    type Request = (Command, mpsc::Sender<io::Result<Child>>);
    static SPAWNER: OnceLock<mpsc::Sender<Request>> = OnceLock::new();

    set_parent_death_signal(&mut command);
    let spawner = SPAWNER.get_or_init(|| {
        let (requests, incoming) = mpsc::channel::<Request>();
        thread::Builder::new()
            .name("testkit-spawner".into())
            .spawn(move || {
                for (mut command, reply) in incoming {
                    let _ = reply.send(command.spawn());
                }
            })
            .expect("cannot start the testkit-spawner thread");
        requests
    });
    let (reply, result) = mpsc::channel();
    spawner
        .send((command, reply))
        .expect("the testkit-spawner thread never exits");
    result
        .recv()
        .expect("the testkit-spawner thread always replies")
}

#[cfg(target_os = "linux")]
fn set_parent_death_signal(command: &mut Command) {
    use std::os::unix::process::CommandExt;
    let parent = std::process::id();
    let hook = move || {
        // SAFETY (of the calls): prctl and getppid are async-signal-safe and touch no memory.
        if unsafe { libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) } == -1 {
            return Err(io::Error::last_os_error());
        }
        // The parent may have died before prctl took effect; then no signal will ever come.
        if u32::try_from(unsafe { libc::getppid() }).ok() != Some(parent) {
            return Err(io::Error::from_raw_os_error(libc::ESRCH));
        }
        Ok(())
    };
    // SAFETY: the hook runs between fork and exec, where only async-signal-safe work is allowed;
    // it makes two such system calls and allocates nothing.
    unsafe {
        command.pre_exec(hook);
    }
}

#[cfg(not(target_os = "linux"))]
fn set_parent_death_signal(_command: &mut Command) {}

/// A replica cut off from its master by [`RedisServer::cut_off_from`]; dropping it lets the
/// replica log in again.
#[derive(Debug)]
pub struct ReplicaCut<'a> {
    replica: &'a RedisServer,
}

impl Drop for ReplicaCut<'_> {
    fn drop(&mut self) {
        if self.replica.is_running() {
            expect_ok(self.replica.command(&["CONFIG", "SET", "masterauth", ""]));
        }
    }
}

/// Asserts a command of the test kit's own succeeded.
pub(crate) fn expect_ok(reply: redis::Value) {
    assert!(
        matches!(reply, redis::Value::Okay | redis::Value::SimpleString(_)),
        "expected OK, got {reply:?}"
    );
}

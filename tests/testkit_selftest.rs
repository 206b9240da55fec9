//! The test kit does what the behaviour tests rely on: servers that start, die, come back on
//! their port and freeze; a proxy that forwards, delays, swallows, blackholes (every connection
//! or a client's subscriptions alone) and resets.

use std::net::TcpStream;
use std::time::{Duration, Instant};

use redis::Value;
use redis::aio::MultiplexedConnection;
use testkit::{Fault, FaultProxy, RedisServer};
use tokio::time::timeout;

/// Long enough for a healthy loopback round trip, short enough to keep the suite quick.
const SHORT: Duration = Duration::from_millis(300);

async fn connect(url: &str) -> MultiplexedConnection {
    let client = redis::Client::open(url).expect("valid url");
    timeout(
        Duration::from_secs(5),
        client.get_multiplexed_async_connection(),
    )
    .await
    .expect("connection within 5 s")
    .expect("connection succeeds")
}

async fn ping(connection: &mut MultiplexedConnection) -> redis::RedisResult<String> {
    redis::cmd("PING").query_async(connection).await
}

#[tokio::test]
async fn server_answers_dies_and_restarts_on_its_port() {
    let mut server = RedisServer::start();
    assert_ne!(
        server.port(),
        6379,
        "tests must never touch the shared redis"
    );
    assert_eq!(server.url(), format!("redis://127.0.0.1:{}", server.port()));
    assert_eq!(server.command(&["SET", "k", "v"]), Value::Okay);
    assert_eq!(
        server.command(&["GET", "k"]),
        Value::BulkString(b"v".to_vec())
    );
    let mut connection = server.connection().await;
    assert_eq!(ping(&mut connection).await.unwrap(), "PONG");

    let (port, first_pid) = (server.port(), server.pid());
    server.kill();
    server.kill(); // idempotent
    assert!(
        TcpStream::connect(server.addr()).is_err(),
        "a killed server refuses connections"
    );

    server.restart();
    assert_eq!(server.port(), port);
    assert_ne!(server.pid(), first_pid);
    assert_eq!(
        server.command(&["GET", "k"]),
        Value::Nil,
        "nothing survives a restart"
    );
    assert_eq!(ping(&mut server.connection().await).await.unwrap(), "PONG");
}

#[tokio::test]
async fn error_replies_come_back_as_values() {
    let server = RedisServer::start_with(&["--maxmemory", "10mb"]);
    assert!(matches!(
        server.command(&["NO-SUCH-COMMAND"]),
        Value::ServerError(_)
    ));
    let maxmemory = server.command(&["CONFIG", "GET", "maxmemory"]);
    assert!(
        format!("{maxmemory:?}").contains("10485760"),
        "extra args apply: {maxmemory:?}"
    );
}

#[tokio::test]
async fn paused_server_answers_only_after_resume() {
    let server = RedisServer::start();
    let mut connection = server.connection().await;

    server.pause();
    assert!(
        timeout(SHORT, ping(&mut connection)).await.is_err(),
        "a paused server answers"
    );

    server.resume();
    let answer = timeout(Duration::from_secs(5), ping(&mut connection)).await;
    assert_eq!(answer.expect("answers after resume").unwrap(), "PONG");
}

#[tokio::test]
async fn dropping_a_paused_server_still_kills_it() {
    let server = RedisServer::start();
    let addr = server.addr();
    server.pause();
    drop(server);
    assert!(
        TcpStream::connect(addr).is_err(),
        "the port is closed once the server is dropped"
    );
}

#[tokio::test]
async fn proxy_passes_blackholes_and_heals() {
    let server = RedisServer::start();
    let proxy = FaultProxy::start(server.addr()).await;
    assert_ne!(proxy.addr(), server.addr());

    let mut connection = connect(&proxy.url()).await;
    assert_eq!(ping(&mut connection).await.unwrap(), "PONG");

    proxy.set(Fault::Blackhole);
    assert!(
        timeout(SHORT, ping(&mut connection)).await.is_err(),
        "a blackhole answers"
    );

    proxy.heal();
    // The blackholed connection lost its request for good; a new one is clean.
    let mut fresh = connect(&proxy.url()).await;
    assert_eq!(ping(&mut fresh).await.unwrap(), "PONG");
}

#[tokio::test]
async fn proxy_blackholes_subscribers_only() {
    let server = RedisServer::start();
    let proxy = FaultProxy::start(server.addr()).await;
    let mut commands = connect(&proxy.url()).await;
    let client = redis::Client::open(proxy.url()).expect("valid url");
    let mut subscription = client.get_async_pubsub().await.expect("pubsub connection");
    subscription.subscribe("before").await.unwrap();

    proxy.set(Fault::BlackholeSubscribers);
    assert!(
        timeout(SHORT, subscription.subscribe("during"))
            .await
            .is_err(),
        "a subscriber's request answered"
    );
    assert_eq!(ping(&mut commands).await.unwrap(), "PONG");
    assert_eq!(
        server.command(&["PUBSUB", "NUMSUB", "during"]),
        Value::Array(vec![Value::BulkString(b"during".to_vec()), Value::Int(0)]),
        "a subscribe passed the blackhole"
    );
}

#[tokio::test]
async fn proxy_delay_holds_back_each_direction() {
    let server = RedisServer::start();
    let proxy = FaultProxy::start(server.addr()).await;
    let mut connection = connect(&proxy.url()).await;

    let delay = Duration::from_millis(150);
    proxy.set(Fault::Delay(delay));
    let started = Instant::now();
    assert_eq!(ping(&mut connection).await.unwrap(), "PONG");
    let round_trip = started.elapsed();
    assert!(
        round_trip >= 2 * delay,
        "request and reply each delayed: took {round_trip:?}"
    );
}

#[tokio::test]
async fn proxy_drop_replies_lets_commands_through_silently() {
    let server = RedisServer::start();
    let proxy = FaultProxy::start(server.addr()).await;
    let mut connection = connect(&proxy.url()).await;

    proxy.set(Fault::DropReplies);
    let mut set_command = redis::cmd("SET");
    set_command.arg("k").arg("v");
    let set = set_command.query_async::<()>(&mut connection);
    assert!(
        timeout(SHORT, set).await.is_err(),
        "the reply should have been swallowed"
    );
    assert_eq!(
        server.command(&["GET", "k"]),
        Value::BulkString(b"v".to_vec())
    );
}

#[tokio::test]
async fn proxy_reset_all_closes_open_connections_only() {
    let server = RedisServer::start();
    let proxy = FaultProxy::start(server.addr()).await;
    let mut connection = connect(&proxy.url()).await;
    assert_eq!(proxy.connections(), 1);

    proxy.reset_all();
    let deadline = Instant::now() + Duration::from_secs(5);
    while proxy.connections() > 0 {
        assert!(
            Instant::now() < deadline,
            "connections still open after reset_all"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let after_reset = timeout(Duration::from_secs(5), ping(&mut connection)).await;
    assert!(
        after_reset.expect("fails fast").is_err(),
        "a reset connection is dead"
    );

    let mut fresh = connect(&proxy.url()).await;
    assert_eq!(ping(&mut fresh).await.unwrap(), "PONG");
    assert_eq!(proxy.connections(), 1);
}

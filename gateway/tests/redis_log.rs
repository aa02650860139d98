//! `RedisLog` against a real `redis-server` (a unix socket in a temporary
//! directory, no TCP port, no persistence), one server per test.
//!
//! What each test shows: events come back in order and exactly after the
//! seq asked for; a read that finds nothing blocks until an append made by
//! another instance (another connection) and never longer than its wait; a
//! finish ends reads and wakes blocked readers; duplicates and gaps are
//! refused; the bounds refuse appends instead of trimming and a reader is
//! told the stream is full; the ttl makes a stream unknown; `open` refuses
//! an existing id; a Redis that is down, stopped or restarted gives fast
//! typed errors without its password, and the log works again once Redis
//! is back.

#![cfg(feature = "redis")]

use std::time::{Duration, Instant};

use bytes::Bytes;
use recovery_gateway::log::{Entry, Limits, LogError, Read, RedisLog, StreamLog};

use recovery_tests::redis::{RedisServer as Redis, TempDir};

/// The test's own connection, to look at keys.
async fn raw(url: &str) -> redis::aio::MultiplexedConnection {
    redis::Client::open(url)
        .expect("url")
        .get_multiplexed_async_connection()
        .await
        .expect("test connection")
}

fn limits() -> Limits {
    Limits {
        max_entries: 1000,
        max_bytes: 1 << 20,
        max_streams: 10,
        max_total_bytes: 1 << 30,
        ttl: Duration::from_mins(1),
    }
}

/// The tests' builder: prefix `t:`, 500 ms timeouts.
macro_rules! options {
    ($limits:expr) => {
        RedisLog::builder($limits)
            .prefix("t:")
            .connect_timeout(Duration::from_millis(500))
            .command_timeout(Duration::from_millis(500))
    };
}

async fn log(dir: &TempDir) -> RedisLog {
    log_with(dir, limits()).await
}

/// A log on the server of `dir` with `limits`.
async fn log_with(dir: &TempDir, limits: Limits) -> RedisLog {
    options!(limits).connect(&dir.url()).await.expect("connect")
}

fn event(stream: &str, seq: u64) -> Entry {
    Entry {
        seq,
        event: Bytes::from(format!("id: {stream}:{seq}\ndata: {{\"n\":{seq}}}\n\n")),
    }
}

fn seqs(read: &Read) -> Vec<u64> {
    read.entries.iter().map(|e| e.seq).collect()
}

const NO_WAIT: Duration = Duration::ZERO;

/// One entry of a Redis stream as `XRANGE` gives it: id, fields.
type Raw = (String, Vec<(String, Vec<u8>)>);

#[tokio::test]
async fn appends_come_back_in_order_after_the_seq_asked_for() {
    let dir = TempDir::new("gateway-redis-log");
    let _redis = Redis::start(&dir);
    let log = log(&dir).await;
    log.open("s1").await.unwrap();
    let empty = log.read("s1", 0, NO_WAIT).await.unwrap();
    assert_eq!((seqs(&empty), empty.finished), (vec![], false));
    for seq in 1..=5 {
        log.append("s1", &[event("s1", seq)]).await.unwrap();
    }
    let all = log.read("s1", 0, NO_WAIT).await.unwrap();
    assert_eq!(seqs(&all), vec![1, 2, 3, 4, 5]);
    assert!(!all.finished);
    for (entry, seq) in all.entries.iter().zip(1..) {
        assert_eq!(entry, &event("s1", seq), "bytes kept exactly");
    }
    let tail = log.read("s1", 3, NO_WAIT).await.unwrap();
    assert_eq!(seqs(&tail), vec![4, 5]);
    let none = log.read("s1", 5, NO_WAIT).await.unwrap();
    assert_eq!((seqs(&none), none.finished), (vec![], false));

    // The layout the module documents: one Redis stream, ids 0-<seq>.
    let mut conn = raw(&dir.url()).await;
    let ids: Vec<Raw> = redis::cmd("XRANGE")
        .arg("t:stream:s1")
        .arg("-")
        .arg("+")
        .query_async(&mut conn)
        .await
        .unwrap();
    let ids: Vec<&str> = ids.iter().map(|(id, _)| id.as_str()).collect();
    assert_eq!(ids, ["0-1", "0-2", "0-3", "0-4", "0-5"]);
}

#[tokio::test]
async fn binary_events_survive() {
    let dir = TempDir::new("gateway-redis-log");
    let _redis = Redis::start(&dir);
    let log = log(&dir).await;
    log.open("bin").await.unwrap();
    let bytes: Vec<u8> = (0..=255u8).chain(*b"\r\n\n").collect();
    let entry = Entry {
        seq: 1,
        event: Bytes::from(bytes),
    };
    log.append("bin", std::slice::from_ref(&entry))
        .await
        .unwrap();
    let read = log.read("bin", 0, NO_WAIT).await.unwrap();
    assert_eq!(read.entries, vec![entry]);
}

#[tokio::test]
async fn duplicates_and_gaps_are_refused() {
    let dir = TempDir::new("gateway-redis-log");
    let _redis = Redis::start(&dir);
    let log = log(&dir).await;
    log.open("d").await.unwrap();
    log.append("d", &[event("d", 1)]).await.unwrap();
    log.append("d", &[event("d", 2)]).await.unwrap();
    assert!(matches!(
        log.append("d", &[event("d", 2)]).await,
        Err(LogError::Store(_))
    ));
    assert!(matches!(
        log.append("d", &[event("d", 4)]).await,
        Err(LogError::Store(_))
    ));
    assert!(matches!(
        log.append("d", &[event("d", 1)]).await,
        Err(LogError::Store(_))
    ));
    let read = log.read("d", 0, NO_WAIT).await.unwrap();
    assert_eq!(seqs(&read), vec![1, 2]);
    log.append("d", &[event("d", 3)]).await.unwrap();
    assert_eq!(seqs(&log.read("d", 2, NO_WAIT).await.unwrap()), vec![3]);
}

#[tokio::test]
async fn a_read_blocks_until_another_instance_appends() {
    let dir = TempDir::new("gateway-redis-log");
    let _redis = Redis::start(&dir);
    let writer = log(&dir).await;
    let reader = log(&dir).await;
    writer.open("live").await.unwrap();
    writer.append("live", &[event("live", 1)]).await.unwrap();
    writer.append("live", &[event("live", 2)]).await.unwrap();

    let started = Instant::now();
    let waiting = tokio::spawn({
        let reader = reader.clone();
        async move { reader.read("live", 2, Duration::from_secs(10)).await }
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        !waiting.is_finished(),
        "the read waits while nothing is there"
    );
    writer.append("live", &[event("live", 3)]).await.unwrap();
    let read = tokio::time::timeout(Duration::from_secs(3), waiting)
        .await
        .expect("woken by the append")
        .unwrap()
        .unwrap();
    let took = started.elapsed();
    assert_eq!(seqs(&read), vec![3]);
    assert!(!read.finished);
    assert!(took >= Duration::from_millis(300), "it did block: {took:?}");
    assert!(took < Duration::from_secs(3), "woken promptly: {took:?}");

    // Many readers at once on one instance, each woken by one append.
    let readers: Vec<_> = (0..20)
        .map(|_| {
            let reader = reader.clone();
            tokio::spawn(async move { reader.read("live", 3, Duration::from_secs(10)).await })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(200)).await;
    writer.append("live", &[event("live", 4)]).await.unwrap();
    for r in readers {
        let read = tokio::time::timeout(Duration::from_secs(3), r)
            .await
            .expect("woken")
            .unwrap()
            .unwrap();
        assert_eq!(seqs(&read), vec![4]);
    }
}

#[tokio::test]
async fn a_read_never_waits_longer_than_its_wait() {
    let dir = TempDir::new("gateway-redis-log");
    let _redis = Redis::start(&dir);
    let log = log(&dir).await;
    log.open("quiet").await.unwrap();
    for wait in [
        Duration::from_micros(300),
        Duration::from_millis(5),
        Duration::from_millis(50),
        Duration::from_millis(400),
    ] {
        let started = Instant::now();
        let read = log.read("quiet", 0, wait).await.unwrap();
        let took = started.elapsed();
        assert_eq!((seqs(&read), read.finished), (vec![], false));
        assert!(
            took <= wait + Duration::from_millis(250),
            "wait {wait:?} took {took:?}"
        );
        if wait >= Duration::from_millis(50) {
            assert!(took >= wait / 2, "wait {wait:?} returned early: {took:?}");
        }
    }
    // With one blocking read allowed, a second one waits for its turn, never
    // past its own wait.
    let one = options!(limits())
        .max_blocking_reads(1)
        .connect(&dir.url())
        .await
        .unwrap();
    let first = tokio::spawn({
        let one = one.clone();
        async move { one.read("quiet", 0, Duration::from_millis(600)).await }
    });
    tokio::time::sleep(Duration::from_millis(50)).await;
    let started = Instant::now();
    let second = one
        .read("quiet", 0, Duration::from_millis(200))
        .await
        .unwrap();
    let took = started.elapsed();
    assert!(second.entries.is_empty());
    assert!(took <= Duration::from_millis(450), "{took:?}");
    assert!(first.await.unwrap().unwrap().entries.is_empty());
}

#[tokio::test]
async fn finish_ends_reads_and_wakes_readers() {
    let dir = TempDir::new("gateway-redis-log");
    let _redis = Redis::start(&dir);
    let writer = log(&dir).await;
    let reader = log(&dir).await;
    writer.open("f").await.unwrap();
    writer.append("f", &[event("f", 1)]).await.unwrap();
    let waiting = tokio::spawn({
        let reader = reader.clone();
        async move { reader.read("f", 1, Duration::from_secs(10)).await }
    });
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(!waiting.is_finished());
    let started = Instant::now();
    writer.finish("f").await.unwrap();
    let read = tokio::time::timeout(Duration::from_secs(3), waiting)
        .await
        .expect("woken by the finish")
        .unwrap()
        .unwrap();
    assert!(started.elapsed() < Duration::from_secs(2));
    assert_eq!((seqs(&read), read.finished), (vec![], true));

    // A finished stream answers at once, whatever the wait.
    let started = Instant::now();
    let all = reader.read("f", 0, Duration::from_secs(10)).await.unwrap();
    assert_eq!((seqs(&all), all.finished), (vec![1], true));
    let past = reader.read("f", 1, Duration::from_secs(10)).await.unwrap();
    assert_eq!((seqs(&past), past.finished), (vec![], true));
    let beyond = reader
        .read("f", u64::MAX, Duration::from_secs(10))
        .await
        .unwrap();
    assert!(beyond.finished);
    assert!(started.elapsed() < Duration::from_secs(1));

    // Nothing is appended after the end; finishing again changes nothing.
    assert!(matches!(
        writer.append("f", &[event("f", 2)]).await,
        Err(LogError::Store(_))
    ));
    writer.finish("f").await.unwrap();
    let again = reader.read("f", 0, NO_WAIT).await.unwrap();
    assert_eq!((seqs(&again), again.finished), (vec![1], true));

    // A stream finished with no event at all.
    writer.open("empty").await.unwrap();
    writer.finish("empty").await.unwrap();
    let read = reader
        .read("empty", 0, Duration::from_secs(5))
        .await
        .unwrap();
    assert_eq!((seqs(&read), read.finished), (vec![], true));
}

#[tokio::test]
async fn bounds_refuse_appends_and_readers_learn_the_stream_is_full() {
    let dir = TempDir::new("gateway-redis-log");
    let _redis = Redis::start(&dir);
    let by_count = log_with(
        &dir,
        Limits {
            max_entries: 3,
            ..limits()
        },
    )
    .await;
    by_count.open("c").await.unwrap();
    for seq in 1..=3 {
        by_count.append("c", &[event("c", seq)]).await.unwrap();
    }
    let waiting = tokio::spawn({
        let log = by_count.clone();
        async move { log.read("c", 3, Duration::from_secs(10)).await }
    });
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(
        by_count.append("c", &[event("c", 4)]).await,
        Err(LogError::StreamFull)
    );
    assert_eq!(
        by_count.append("c", &[event("c", 5)]).await,
        Err(LogError::StreamFull),
        "full stays full"
    );
    let woken = tokio::time::timeout(Duration::from_secs(3), waiting)
        .await
        .expect("a blocked reader hears of it")
        .unwrap();
    assert_eq!(woken, Err(LogError::StreamFull));
    // Nothing kept was trimmed; the end is an error, not a finish.
    let read = by_count.read("c", 0, NO_WAIT).await.unwrap();
    assert_eq!((seqs(&read), read.finished), (vec![1, 2, 3], false));
    assert_eq!(
        by_count.read("c", 3, Duration::from_secs(5)).await,
        Err(LogError::StreamFull)
    );
    by_count.finish("c").await.unwrap();
    assert_eq!(
        by_count.read("c", 3, NO_WAIT).await,
        Err(LogError::StreamFull)
    );

    let by_bytes = log_with(
        &dir,
        Limits {
            max_bytes: 100,
            ..limits()
        },
    )
    .await;
    by_bytes.open("b").await.unwrap();
    let forty = |seq| Entry {
        seq,
        event: Bytes::from(vec![b'x'; 40]),
    };
    by_bytes.append("b", &[forty(1)]).await.unwrap();
    by_bytes.append("b", &[forty(2)]).await.unwrap();
    assert_eq!(
        by_bytes.append("b", &[forty(3)]).await,
        Err(LogError::StreamFull)
    );
    let read = by_bytes.read("b", 0, NO_WAIT).await.unwrap();
    assert_eq!(seqs(&read), vec![1, 2]);
    assert_eq!(
        by_bytes.read("b", 2, NO_WAIT).await,
        Err(LogError::StreamFull)
    );
}

#[tokio::test]
async fn a_batch_is_appended_in_one_call_whole_or_not_at_all() {
    let dir = TempDir::new("gateway-redis-log");
    let _redis = Redis::start(&dir);
    let log = log_with(
        &dir,
        Limits {
            max_entries: 4,
            ..limits()
        },
    )
    .await;
    log.open("m").await.unwrap();
    log.append("m", &[]).await.unwrap();
    log.append("m", &[event("m", 1), event("m", 2), event("m", 3)])
        .await
        .unwrap();
    let read = log.read("m", 0, NO_WAIT).await.unwrap();
    assert_eq!(seqs(&read), vec![1, 2, 3]);
    assert_eq!(read.entries[1], event("m", 2));
    // A gap inside a batch, or a batch that does not follow the last seq.
    assert!(matches!(
        log.append("m", &[event("m", 4), event("m", 6)]).await,
        Err(LogError::Store(_))
    ));
    assert!(matches!(
        log.append("m", &[event("m", 5), event("m", 6)]).await,
        Err(LogError::Store(_))
    ));
    // Past the bound of four entries: none of the two, and full.
    assert_eq!(
        log.append("m", &[event("m", 4), event("m", 5)]).await,
        Err(LogError::StreamFull)
    );
    let read = log.read("m", 0, NO_WAIT).await.unwrap();
    assert_eq!((seqs(&read), read.finished), (vec![1, 2, 3], false));
    assert_eq!(log.read("m", 3, NO_WAIT).await, Err(LogError::StreamFull));
}

#[tokio::test]
async fn the_ttl_is_refreshed_and_then_the_stream_is_unknown() {
    let dir = TempDir::new("gateway-redis-log");
    let _redis = Redis::start(&dir);
    let ttl = Duration::from_millis(1500);
    let log = log_with(&dir, Limits { ttl, ..limits() }).await;
    let mut conn = raw(&dir.url()).await;
    let pttl = |key: &'static str| {
        let mut conn = conn.clone();
        async move {
            redis::cmd("PTTL")
                .arg(key)
                .query_async::<i64>(&mut conn)
                .await
                .unwrap()
        }
    };
    log.open("t").await.unwrap();
    assert!(pttl("t:meta:t").await > 0, "an opened stream expires too");
    log.append("t", &[event("t", 1)]).await.unwrap();
    // Appends keep a live stream alive past its first ttl.
    for seq in 2..=4 {
        tokio::time::sleep(Duration::from_millis(600)).await;
        log.append("t", &[event("t", seq)]).await.unwrap();
        let left = pttl("t:stream:t").await;
        assert!(left > 1000 && left <= 1500, "refreshed on append: {left}");
    }
    log.finish("t").await.unwrap();
    let left = pttl("t:meta:t").await;
    assert!(left > 1000 && left <= 1500, "set on finish: {left}");
    assert_eq!(
        seqs(&log.read("t", 0, NO_WAIT).await.unwrap()),
        vec![1, 2, 3, 4]
    );
    tokio::time::sleep(Duration::from_millis(1800)).await;
    assert_eq!(log.read("t", 0, NO_WAIT).await, Err(LogError::Unknown));
    assert_eq!(
        log.append("t", &[event("t", 5)]).await,
        Err(LogError::Unknown)
    );
    assert_eq!(log.finish("t").await, Err(LogError::Unknown));
    let exists: i64 = redis::cmd("EXISTS")
        .arg("t:stream:t")
        .arg("t:meta:t")
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(exists, 0, "nothing left behind");
    // The id may be used again once it expired.
    log.open("t").await.unwrap();
}

#[tokio::test]
async fn open_refuses_an_existing_id_and_reads_of_unknown_ids_fail() {
    let dir = TempDir::new("gateway-redis-log");
    let _redis = Redis::start(&dir);
    let a = log(&dir).await;
    let b = log(&dir).await;
    a.open("x").await.unwrap();
    assert_eq!(a.open("x").await, Err(LogError::Exists));
    assert_eq!(b.open("x").await, Err(LogError::Exists), "across instances");
    a.append("x", &[event("x", 1)]).await.unwrap();
    a.finish("x").await.unwrap();
    assert_eq!(
        b.open("x").await,
        Err(LogError::Exists),
        "finished, not expired"
    );

    let started = Instant::now();
    assert_eq!(
        b.read("never", 0, Duration::from_secs(10)).await,
        Err(LogError::Unknown),
        "unknown at once, no waiting"
    );
    assert!(started.elapsed() < Duration::from_secs(1));
    assert_eq!(
        b.append("never", &[event("never", 1)]).await,
        Err(LogError::Unknown)
    );
    assert_eq!(b.finish("never").await, Err(LogError::Unknown));
    let long = "z".repeat(10_000);
    assert_eq!(b.read(&long, 0, NO_WAIT).await, Err(LogError::Unknown));

    // Another prefix is another namespace.
    let other = RedisLog::connect(&dir.url(), limits(), "other:")
        .await
        .unwrap();
    other.open("x").await.unwrap();
    assert_eq!(other.read("x", 0, NO_WAIT).await.unwrap().entries, vec![]);
}

#[tokio::test]
async fn a_redis_that_is_down_fails_fast_with_a_typed_error() {
    let dir = TempDir::new("gateway-redis-log");
    // Never started: connecting fails, without the password in the text.
    let url = format!("{}?pass=s3cret-pw", dir.url());
    let started = Instant::now();
    let err = RedisLog::connect(&url, limits(), "t:").await.unwrap_err();
    assert!(started.elapsed() < Duration::from_secs(1));
    let LogError::Store(text) = &err else {
        panic!("{err:?}")
    };
    assert!(!text.contains("s3cret") && !format!("{err:?} {err}").contains("s3cret"));

    // A lazy log answers every call with a fast typed error.
    let lazy = options!(limits()).lazy(&url).unwrap();
    assert!(!format!("{lazy:?}").contains("s3cret"));
    let started = Instant::now();
    for _ in 0..50 {
        assert!(matches!(lazy.open("a").await, Err(LogError::Store(_))));
        assert!(matches!(
            lazy.append("a", &[event("a", 1)]).await,
            Err(LogError::Store(_))
        ));
        assert!(matches!(
            lazy.read("a", 0, Duration::from_secs(10)).await,
            Err(LogError::Store(_))
        ));
        assert!(matches!(lazy.finish("a").await, Err(LogError::Store(_))));
    }
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "200 calls against a dead Redis: {:?}",
        started.elapsed()
    );

    // Redis comes up (with that password): the lazy log connects.
    let mut redis = Redis::start_with(&dir, &["--requirepass", "s3cret-pw"]);
    tokio::time::sleep(Duration::from_millis(300)).await;
    lazy.open("a").await.unwrap();
    lazy.append("a", &[event("a", 1)]).await.unwrap();

    // A wrong password: a typed error that shows neither password.
    let wrong = format!("{}?pass=other-s3cret", dir.url());
    let err = RedisLog::connect(&wrong, limits(), "t:").await.unwrap_err();
    assert!(matches!(err, LogError::Store(_)));
    assert!(!format!("{err:?}").contains("s3cret"), "{err:?}");

    // Killed while a reader waits: the reader gets an error, not a hang.
    let waiting = tokio::spawn({
        let lazy = lazy.clone();
        async move { lazy.read("a", 1, Duration::from_secs(30)).await }
    });
    tokio::time::sleep(Duration::from_millis(200)).await;
    redis.kill();
    let woken = tokio::time::timeout(Duration::from_secs(3), waiting)
        .await
        .expect("no hang when Redis dies")
        .unwrap();
    assert!(matches!(woken, Err(LogError::Store(_))), "{woken:?}");
    let started = Instant::now();
    assert!(matches!(
        lazy.append("a", &[event("a", 2)]).await,
        Err(LogError::Store(_))
    ));
    assert!(started.elapsed() < Duration::from_secs(1));
}

#[tokio::test]
async fn a_stopped_redis_times_out_and_a_restarted_one_is_used_again() {
    let dir = TempDir::new("gateway-redis-log");
    let mut redis = Redis::start(&dir);
    let log = options!(limits())
        .connect_timeout(Duration::from_millis(300))
        .command_timeout(Duration::from_millis(300))
        .connect(&dir.url())
        .await
        .unwrap();
    log.open("s").await.unwrap();
    log.append("s", &[event("s", 1)]).await.unwrap();
    // A blocking read leaves its connection in the pool.
    let quiet = log.read("s", 1, Duration::from_millis(100)).await.unwrap();
    assert!(quiet.entries.is_empty());

    // Stopped: it accepts connections but answers nothing.
    redis.signal("STOP");
    for _ in 0..3 {
        let started = Instant::now();
        let result = log.append("s", &[event("s", 2)]).await;
        assert!(matches!(result, Err(LogError::Store(_))), "{result:?}");
        assert!(
            started.elapsed() < Duration::from_millis(1500),
            "{:?}",
            started.elapsed()
        );
        let started = Instant::now();
        let result = log.read("s", 1, Duration::from_secs(20)).await;
        assert!(matches!(result, Err(LogError::Store(_))), "{result:?}");
        assert!(
            started.elapsed() < Duration::from_millis(1500),
            "{:?}",
            started.elapsed()
        );
    }
    redis.signal("CONT");
    tokio::time::sleep(Duration::from_millis(400)).await;
    // The append that timed out may or may not have reached Redis.
    let result = log.append("s", &[event("s", 2)]).await;
    assert!(
        matches!(result, Ok(()) | Err(LogError::Store(_))),
        "{result:?}"
    );
    assert_eq!(seqs(&log.read("s", 0, NO_WAIT).await.unwrap()), vec![1, 2]);

    // Restarted empty (no persistence): scripts are loaded again, the old
    // stream is gone, new ones work.
    redis.kill();
    let _redis = Redis::start(&dir);
    let mut last = Err(LogError::Unknown);
    for _ in 0..20 {
        last = log.open("after-restart").await;
        if last.is_ok() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(last, Ok(()));
    log.append("after-restart", &[event("after-restart", 1)])
        .await
        .unwrap();
    assert_eq!(log.read("s", 0, NO_WAIT).await, Err(LogError::Unknown));
    let read = log.read("after-restart", 0, NO_WAIT).await.unwrap();
    assert_eq!(seqs(&read), vec![1]);
    // Blocking reads work again too (pooled connections died with Redis).
    let waiting = tokio::spawn({
        let log = log.clone();
        async move { log.read("after-restart", 1, Duration::from_secs(10)).await }
    });
    tokio::time::sleep(Duration::from_millis(200)).await;
    log.append("after-restart", &[event("after-restart", 2)])
        .await
        .unwrap();
    let woken = tokio::time::timeout(Duration::from_secs(3), waiting)
        .await
        .expect("woken")
        .unwrap()
        .unwrap();
    assert_eq!(seqs(&woken), vec![2]);
}

//! When Redis is not there, or goes away: requests complete, cooldowns
//! hold within the process, no call waits for Redis, and the store
//! reconnects (and shares what it learned meanwhile) once Redis is back.

mod support;

use std::sync::Arc;
use std::time::{Duration, Instant as StdInstant};

use recovery_core::budget::{BudgetStore, RetryBudgetConfig};
use recovery_core::cooldown::CooldownStore;
use recovery_redis::{RedisBudget, RedisCooldowns, RedisOptions};
use support::{Provider, RedisServer, TempDir, eventually, now};

/// Quick to notice and to come back, so the test stays short.
fn options() -> RedisOptions {
    RedisOptions::default()
        .connect_timeout(Duration::from_millis(300))
        .command_timeout(Duration::from_millis(300))
        .max_backoff(Duration::from_millis(200))
}

/// No store call may take long: they never touch Redis.
fn quick<T>(what: &str, f: impl FnOnce() -> T) -> T {
    let start = StdInstant::now();
    let out = f();
    assert!(
        // Local work is microseconds; the bound stays under the 300 ms
        // connect and command timeouts a wait on Redis would show, with
        // room for a loaded machine.
        start.elapsed() < Duration::from_millis(250),
        "{what} took {:?}",
        start.elapsed()
    );
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_redis_cooldowns_hold_locally_and_the_store_reconnects() {
    let dir = TempDir::new("redis-store");
    // Nothing listens at the socket yet.
    let store = quick("connect", || RedisCooldowns::connect(&dir.url(), options()))
        .expect("a store even without Redis");
    let waited = StdInstant::now();
    assert!(
        !store.ready(Duration::from_millis(300)).await,
        "no Redis: not ready"
    );
    assert!(
        waited.elapsed() < Duration::from_secs(1),
        "ready() is bounded"
    );
    assert!(!store.status().connected);

    // Two requests through the layer: the first learns a 429 with a wait,
    // the second starts after that and holds its send until the wait ends.
    let provider = Provider::start(("retry-after-ms", "400")).await;
    let shared: Arc<dyn CooldownStore> = Arc::new(store.clone());
    let url = provider.url();
    let first = tokio::spawn({
        let (shared, url) = (Arc::clone(&shared), url.clone());
        async move { support::send(shared, &url, "a").await }
    });
    assert!(eventually(Duration::from_secs(5), || !provider.sends().is_empty()).await);
    let told_at = provider.sends()[0].at;
    let key = recovery_core::cooldown::key_for(&url, support::BODY);
    assert!(
        eventually(Duration::from_secs(2), || shared
            .remaining(&key, now())
            .is_some())
        .await,
        "the 429's wait is noted"
    );
    let second = tokio::time::timeout(
        Duration::from_secs(10),
        support::send(Arc::clone(&shared), &url, "b"),
    )
    .await
    .expect("no hang");
    let first = tokio::time::timeout(Duration::from_secs(10), first)
        .await
        .expect("no hang")
        .expect("task");
    for done in [&first, &second] {
        assert!(
            done.status == 200 && done.completed && done.body_ok,
            "{done:?}"
        );
    }
    assert_eq!((first.attempts, second.attempts), (2, 1));
    let sends = provider.sends();
    let b = sends.iter().find(|s| s.client == "b").expect("b sent");
    assert!(
        b.at.duration_since(told_at) >= Duration::from_millis(385),
        "b waited out the local cooldown: sent {:?} after the 429",
        b.at.duration_since(told_at)
    );

    // A note made while Redis is away: local at once, shared later.
    quick("note", || {
        store.note("outage", now(), Duration::from_secs(30));
    });
    let left = quick("remaining", || store.remaining("outage", now()));
    assert!(
        left.is_some_and(|l| l > Duration::from_secs(29)),
        "{left:?}"
    );

    // Redis comes up at that socket: the store connects by itself and
    // writes what it noted meanwhile.
    let mut redis = RedisServer::start(&dir);
    assert!(
        store.ready(Duration::from_secs(5)).await,
        "reconnected: {:?}",
        store.status()
    );
    let mut conn = support::redis_conn(&dir.url()).await;
    let mut ttl = -2;
    for _ in 0..100 {
        ttl = support::pttl(&mut conn, "recovery:cooldown:outage").await;
        if ttl > 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(
        ttl > 28_000 && ttl <= 30_000,
        "the outage's note reached Redis: PTTL {ttl}"
    );
    let later = RedisCooldowns::connect(&dir.url(), options()).expect("store");
    assert!(later.ready(Duration::from_secs(5)).await);
    assert!(
        later.remaining("outage", now()).is_some(),
        "a later process learns it"
    );

    // Redis dies mid-run: calls stay instant, notes stay local.
    redis.kill();
    assert!(
        eventually(Duration::from_secs(5), || !store.status().connected).await,
        "the store notices the loss"
    );
    quick("note while down", || {
        store.note("second", now(), Duration::from_secs(20));
    });
    assert!(quick("remaining while down", || store.remaining("second", now())).is_some());
    assert!(later.remaining("second", now()).is_none(), "not shared yet");
    let failures = store.status().failures;

    // And back again: reconnect, and the other store hears of the note.
    let _redis = RedisServer::start(&dir);
    assert!(
        store.ready(Duration::from_secs(5)).await,
        "{:?}",
        store.status()
    );
    assert!(store.status().connects >= 2);
    assert!(store.status().failures >= failures);
    assert!(later.ready(Duration::from_secs(5)).await);
    assert!(
        eventually(Duration::from_secs(5), || later
            .remaining("second", now())
            .is_some())
        .await,
        "shared after the reconnect"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_redis_the_budget_is_the_in_memory_one() {
    let dir = TempDir::new("redis-store");
    let budget = quick("connect", || {
        RedisBudget::connect(&dir.url(), RetryBudgetConfig::default(), options())
    })
    .expect("a budget even without Redis");
    assert!(!budget.ready(Duration::from_millis(300)).await);
    assert!(!budget.uses_fleet_view());
    // The default budget alone: a reserve of 10, plus 20 % of requests.
    let mut granted = 0;
    for _ in 0..100 {
        quick("deposit", || budget.deposit(now()));
        if quick("withdraw", || budget.withdraw(now())).is_some() {
            granted += 1;
        }
    }
    assert_eq!(granted, 10 + 20);
    assert!(budget.withdraw(now()).is_none());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redis_that_stops_answering_holds_nothing() {
    let dir = TempDir::new("redis-store");
    let redis = RedisServer::start(&dir);
    let fast = options().flush_interval(Duration::from_millis(50));
    let store = RedisCooldowns::connect(&dir.url(), fast.clone()).expect("store");
    let budget =
        RedisBudget::connect(&dir.url(), RetryBudgetConfig::default(), fast).expect("budget");
    assert!(
        store.ready(Duration::from_secs(3)).await && budget.ready(Duration::from_secs(3)).await
    );
    assert!(budget.uses_fleet_view());

    // Redis hangs: connections open, no answers.
    redis.signal("STOP");
    quick("note", || {
        store.note("k", now(), Duration::from_secs(20));
    });
    assert!(quick("remaining", || store.remaining("k", now())).is_some());
    assert!(
        eventually(Duration::from_secs(3), || !store.status().connected).await,
        "the write timed out and the store went local: {:?}",
        store.status()
    );
    assert!(
        eventually(Duration::from_secs(3), || !budget.uses_fleet_view()).await,
        "the budget stopped trusting an old fleet view"
    );
    for _ in 0..3 {
        quick("deposit", || budget.deposit(now()));
        assert!(
            quick("withdraw", || budget.withdraw(now())).is_some(),
            "the local reserve"
        );
    }
    // A request through the layer is not held by the hung Redis.
    let provider = Provider::start(("retry-after-ms", "100")).await;
    let done = tokio::time::timeout(
        Duration::from_secs(10),
        support::send(Arc::new(store.clone()), &provider.url(), "a"),
    )
    .await
    .expect("no hang");
    assert!(done.status == 200 && done.completed, "{done:?}");

    // It answers again: the store reconnects and writes its note.
    redis.signal("CONT");
    assert!(
        store.ready(Duration::from_secs(5)).await,
        "{:?}",
        store.status()
    );
    assert!(budget.ready(Duration::from_secs(5)).await);
    assert!(eventually(Duration::from_secs(2), || budget.uses_fleet_view()).await);
    let mut conn = support::redis_conn(&dir.url()).await;
    let mut ttl = -2;
    for _ in 0..100 {
        ttl = support::pttl(&mut conn, "recovery:cooldown:k").await;
        if ttl > 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(ttl > 15_000, "written after the hang: PTTL {ttl}");
}

//! Two stores on one Redis stand for two processes (separate connections,
//! separate mirrors): what one notes or counts, the other sees; keys expire
//! on their own.

mod support;

use std::time::Duration;

use recovery_core::budget::{BudgetStore, RetryBudgetConfig};
use recovery_core::cooldown::CooldownStore;
use recovery_redis::{RedisBudget, RedisCooldowns, RedisOptions};
use support::{RedisServer, TempDir, eventually, now};

const SOON: Duration = Duration::from_secs(3);

fn fast() -> RedisOptions {
    RedisOptions::default().flush_interval(Duration::from_millis(50))
}

async fn exists(conn: &mut redis::aio::MultiplexedConnection, key: &str) -> bool {
    redis::cmd("EXISTS")
        .arg(key)
        .query_async::<i64>(conn)
        .await
        .expect("EXISTS")
        == 1
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cooldown_reaches_the_other_process_and_expires() {
    let dir = TempDir::new("redis-store");
    let _redis = RedisServer::start(&dir);
    let url = dir.url();
    let a = RedisCooldowns::connect(&url, RedisOptions::default()).expect("a");
    let b = RedisCooldowns::connect(&url, RedisOptions::default()).expect("b");
    let other_fleet =
        RedisCooldowns::connect(&url, RedisOptions::default().prefix("elsewhere:")).expect("c");
    for store in [&a, &b, &other_fleet] {
        assert!(store.ready(SOON).await);
    }
    a.note("k", now(), Duration::from_millis(800));
    assert!(
        eventually(SOON, || b.remaining("k", now()).is_some()).await,
        "b hears of a's note"
    );
    let left = b.remaining("k", now()).unwrap();
    assert!(
        left <= Duration::from_millis(800) && left > Duration::from_millis(300),
        "{left:?}"
    );
    assert!(
        other_fleet.remaining("k", now()).is_none(),
        "another prefix, another fleet"
    );

    let mut conn = support::redis_conn(&url).await;
    let ttl = support::pttl(&mut conn, "recovery:cooldown:k").await;
    assert!(ttl > 0 && ttl <= 800, "PTTL {ttl}");
    // Both the key and the mirrors let go once the wait is over.
    tokio::time::sleep(Duration::from_millis(850)).await;
    assert!(
        !exists(&mut conn, "recovery:cooldown:k").await,
        "expired in Redis"
    );
    assert!(a.remaining("k", now()).is_none());
    assert!(b.remaining("k", now()).is_none());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shorter_wait_never_shortens_and_a_late_process_learns_what_is_in_force() {
    let dir = TempDir::new("redis-store");
    let _redis = RedisServer::start(&dir);
    let url = dir.url();
    let a = RedisCooldowns::connect(&url, RedisOptions::default()).expect("a");
    let b = RedisCooldowns::connect(&url, RedisOptions::default()).expect("b");
    assert!(a.ready(SOON).await && b.ready(SOON).await);
    a.note("k", now(), Duration::from_secs(5));
    assert!(eventually(SOON, || b.remaining("k", now()).is_some()).await);
    // b learns a shorter wait on its own: Redis keeps the longer one.
    b.note("k", now(), Duration::from_secs(1));
    let mut conn = support::redis_conn(&url).await;
    tokio::time::sleep(Duration::from_millis(100)).await;
    let ttl = support::pttl(&mut conn, "recovery:cooldown:k").await;
    assert!(ttl > 4_000, "not shortened: PTTL {ttl}");
    assert!(
        b.remaining("k", now())
            .is_some_and(|l| l > Duration::from_secs(4))
    );

    // A process that starts now reads it at connect time.
    let late = RedisCooldowns::connect(&url, RedisOptions::default()).expect("late");
    assert!(late.ready(SOON).await);
    let left = late.remaining("k", now()).expect("learned at startup");
    assert!(
        left > Duration::from_secs(4) && left <= Duration::from_secs(5),
        "{left:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_processes_share_one_budget() {
    let dir = TempDir::new("redis-store");
    let _redis = RedisServer::start(&dir);
    let url = dir.url();
    // No reserve, every request pays for one retry: the balance is the
    // fleet's deposits minus its withdrawals.
    let config = RetryBudgetConfig::new(Duration::from_secs(10), 0, 1.0);
    let a = RedisBudget::connect(&url, config, fast()).expect("a");
    let b = RedisBudget::connect(&url, config, fast()).expect("b");
    assert!(a.ready(SOON).await && b.ready(SOON).await);
    assert!(a.uses_fleet_view() && b.uses_fleet_view());
    for _ in 0..3 {
        a.deposit(now());
    }
    assert!(
        eventually(SOON, || b.balance(now()) == 3).await,
        "b sees a's deposits: {}",
        b.balance(now())
    );
    for i in 0..3 {
        assert!(b.withdraw(now()).is_some(), "retry {i}");
    }
    assert!(b.withdraw(now()).is_none(), "the fleet's budget is spent");
    assert!(
        eventually(SOON, || a.balance(now()) == 0).await,
        "a sees b's withdrawals"
    );
    assert!(a.withdraw(now()).is_none());
    // A refund travels too.
    a.deposit(now());
    assert!(eventually(SOON, || b.balance(now()) == 1).await);
    let token = b.withdraw(now()).expect("one");
    b.refund(token);
    assert!(eventually(SOON, || a.balance(now()) == 1).await);

    let mut conn = support::redis_conn(&url).await;
    let ttl = support::pttl(&mut conn, "recovery:budget:default").await;
    assert!(ttl > 0 && ttl <= 11_000, "a window and a slot: PTTL {ttl}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_reserve_is_the_fleets_not_each_processes() {
    let dir = TempDir::new("redis-store");
    let _redis = RedisServer::start(&dir);
    let url = dir.url();
    // The default: 1 retry/s over 10 s, 20 % of requests.
    let a = RedisBudget::connect(&url, RetryBudgetConfig::default(), fast()).expect("a");
    let b = RedisBudget::connect(&url, RetryBudgetConfig::default(), fast()).expect("b");
    assert!(a.ready(SOON).await && b.ready(SOON).await);
    for _ in 0..6 {
        assert!(a.withdraw(now()).is_some());
    }
    assert!(
        eventually(SOON, || b.balance(now()) == 4).await,
        "10 for the fleet, 6 taken by a: b has {}",
        b.balance(now())
    );
    let mut granted = 0;
    while b.withdraw(now()).is_some() {
        granted += 1;
    }
    assert_eq!(granted, 4);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn budget_counts_leave_with_the_window() {
    let dir = TempDir::new("redis-store");
    let _redis = RedisServer::start(&dir);
    let url = dir.url();
    // The shortest window: 1 s in ten slots of 100 ms.
    let config = RetryBudgetConfig::new(Duration::from_secs(1), 0, 1.0);
    let a = RedisBudget::connect(&url, config, fast()).expect("a");
    let b = RedisBudget::connect(&url, config, fast()).expect("b");
    assert!(a.ready(SOON).await && b.ready(SOON).await);
    a.deposit(now());
    a.deposit(now());
    assert!(eventually(SOON, || b.balance(now()) == 2).await);
    let mut conn = support::redis_conn(&url).await;
    let ttl = support::pttl(&mut conn, "recovery:budget:default").await;
    assert!(ttl > 0 && ttl <= 1_100, "PTTL {ttl}");
    assert!(
        eventually(Duration::from_millis(1_500), || b.balance(now()) == 0).await,
        "the deposits left the window"
    );
    assert!(
        eventually(Duration::from_millis(500), || a.balance(now()) == 0).await,
        "for a too"
    );
    // Nobody wrote since: the hash expired on its own.
    let mut gone = false;
    for _ in 0..50 {
        if !exists(&mut conn, "recovery:budget:default").await {
            gone = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(gone, "the budget's key expired");
}

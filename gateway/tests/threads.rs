//! A gateway served by several threads (`Config::threads`): each thread
//! accepts on the one port with a runtime and upstream pools of its own,
//! while the streams, their keys and the bounds are the gateway's, whichever
//! thread a request lands on.

mod support;

use recovery_gateway::{Config, Gateway};
use recovery_tests::fault::{FaultProvider, Script, ScriptSet};
use support::*;

/// Threads in these tests: connections spread over them by the kernel.
const THREADS: usize = 4;

/// A gateway on [`THREADS`] threads in front of a provider that answers
/// every request with `script`, its config tuned by `tune`.
async fn threaded(script: Script, tune: impl FnOnce(&mut Config)) -> (FaultProvider, Gateway) {
    let provider = FaultProvider::start(ScriptSet::new(vec![]).with_default(script))
        .await
        .unwrap();
    let (mut config, _) = config(&provider);
    config.threads = THREADS;
    tune(&mut config);
    (provider, gateway(config).await)
}

#[tokio::test]
async fn a_stream_made_on_one_thread_is_read_again_on_any() {
    let (provider, gw) = threaded(happy(), |_| {}).await;
    for _ in 0..32 {
        // Each request on a connection of its own, so on any thread.
        let first = send(post(gw.url(CHAT), CHAT_BODY)).await;
        assert_eq!(first.status, 200, "{}", first.text());
        let sid = first.stream_id();
        let again = send(get(gw.url(&format!("/streams/{sid}")))).await;
        assert_eq!(
            again.status,
            200,
            "a stream is read with its credentials, whichever thread made it: {}",
            again.text()
        );
        assert_eq!(without_ids(&again.text()), without_ids(&first.text()));
        let other = send(get_as(
            gw.url(&format!("/streams/{sid}")),
            &[("authorization", "Bearer sk-someone-else-4567")],
        ))
        .await;
        assert_eq!(other.status, 404, "and not with any other credentials");
    }
    // Sequential requests on one thread share its pooled upstream
    // connection; the threads have a pool each.
    assert!(
        provider.stats().connections_accepted >= 2,
        "more than one thread served: {:?}",
        provider.stats()
    );
    assert_eq!(provider.count(), 32, "every stream went upstream once");
    gw.shutdown().await;
}

#[tokio::test]
async fn readers_on_other_threads_follow_a_live_stream() {
    let (provider, gw) = threaded(stalled(), |_| {}).await;
    let mut first = Live::open(post(gw.url(CHAT), CHAT_BODY)).await;
    assert_eq!(first.status, 200);
    let sid = first.stream_id();
    first.events(1).await;
    // Reconnects, each on a connection of its own (so on any thread),
    // while the generation is still going on the thread that started it.
    let mut readers = Vec::new();
    for _ in 0..4 {
        let mut req = post(gw.url(CHAT), CHAT_BODY);
        req.headers_mut()
            .insert("last-event-id", format!("{sid}:1").parse().unwrap());
        let reader = Live::open(req).await;
        assert_eq!(reader.status, 200);
        assert_eq!(reader.stream_id(), sid);
        readers.push(reader);
    }
    provider.wait_for_stalls(1).await;
    provider.release(1);
    for mut live in readers.into_iter().chain([first]) {
        let rest = live.events(1).await;
        assert_eq!(event_id(&rest[0]), Some(format!("{sid}:2")));
        assert!(rest[0].contains("data: [DONE]"), "{rest:?}");
    }
    assert_eq!(provider.count(), 1, "one generation for all readers");
    gw.shutdown().await;
}

#[tokio::test]
async fn the_bound_on_streams_counts_every_thread() {
    let (provider, gw) = threaded(stalled(), |c| {
        c.max_streams = 2;
        // The held generations stall: the shutdown ends them.
        c.shutdown_grace = std::time::Duration::from_millis(200);
    })
    .await;
    let mut held = Vec::new();
    let mut refused = 0;
    for _ in 0..8 {
        let mut live = Live::open(post(gw.url(CHAT), CHAT_BODY)).await;
        if live.status == 200 {
            live.events(1).await;
            held.push(live);
        } else {
            assert_eq!(live.status, 503);
            refused += 1;
        }
    }
    assert_eq!(held.len(), 2, "two streams at once, over all threads");
    assert_eq!(refused, 6);
    assert_eq!(provider.count(), 2, "a refused request never went upstream");
    drop(held);
    gw.shutdown().await;
}

#[tokio::test]
async fn after_shutdown_no_thread_accepts() {
    let (_provider, gw) = threaded(happy(), |_| {}).await;
    let addr = gw.local_addr();
    for _ in 0..8 {
        assert_eq!(send(post(gw.url(CHAT), CHAT_BODY)).await.status, 200);
    }
    tokio::time::timeout(LIMIT, gw.shutdown())
        .await
        .expect("every serving thread stops");
    for _ in 0..32 {
        assert!(
            tokio::net::TcpStream::connect(addr).await.is_err(),
            "no listener of any thread is left"
        );
    }
}

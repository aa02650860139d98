//! Lanes: as many connections to an HTTP/2 origin as its streams need.
//!
//! hyper-util's pool keeps one HTTP/2 connection per origin and sends every
//! request to that origin over it. A server takes only so many streams at
//! once on a connection (its `SETTINGS_MAX_CONCURRENT_STREAMS`, commonly
//! 100 to 256); past that, hyper holds the next request in its dispatch
//! queue until a stream on the connection ends. Streamed LLM answers last
//! seconds to minutes, so the 101st stream would wait on the first to
//! finish: to its caller, a hang before the first byte.
//!
//! So the modes that may speak HTTP/2 keep lanes: lane `i` is a pool of its
//! own, hence at most one HTTP/2 connection per origin, and a request goes
//! to the first lane whose streams open to its origin are fewer than the
//! per-connection bound, opening a lane when every one is full. hyper does
//! not say what the server advertised, so the bound is the client's
//! (100 by default: RFC 9113 recommends a server allow no fewer). A request
//! that negotiates HTTP/1.1 (`auto` mode) is counted the same way; its lane
//! only decides which pool's idle connections it reuses.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use http::Uri;
use http::uri::{Authority, Scheme};

/// Where a lane's streams go: a scheme and an authority.
type Origin = (Scheme, Authority);

/// Lanes of pools `P`, built by the caller as they are needed.
#[derive(Debug)]
pub(super) struct Lanes<P> {
    /// Streams one lane's connection to an origin carries at once.
    per_connection: usize,
    state: Mutex<State<P>>,
}

#[derive(Debug)]
struct State<P> {
    /// Lane `i`'s pool.
    pools: Vec<P>,
    /// Per origin, the streams open on each lane (index = lane).
    open: HashMap<Origin, Vec<Arc<AtomicUsize>>>,
    /// Origins counted at which those with no stream open are forgotten:
    /// twice as many as were left the last time (at least
    /// [`PRUNE_AT_LEAST`]), so a client that meets ever new origins keeps
    /// the ones it is streaming from only, at a cost spread over its
    /// requests.
    prune_at: usize,
}

/// The fewest origins counted before any is forgotten.
const PRUNE_AT_LEAST: usize = 64;

/// One open stream on a lane; dropped when the stream ends, freeing its
/// place.
#[derive(Debug)]
pub(super) struct Slot(Arc<AtomicUsize>);

impl Drop for Slot {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Release);
    }
}

impl<P: Clone> Lanes<P> {
    /// No lanes yet; each connection carries `per_connection` streams at
    /// most (at least 1).
    pub(super) fn new(per_connection: usize) -> Self {
        Lanes {
            per_connection: per_connection.max(1),
            state: Mutex::new(State {
                pools: Vec::new(),
                open: HashMap::new(),
                prune_at: PRUNE_AT_LEAST,
            }),
        }
    }

    /// The pool to send a request for `uri` through, with its place on the
    /// lane (`None` for a URI without an origin, which the pool refuses).
    /// `build` makes the pool of a new lane.
    pub(super) fn pick(&self, uri: &Uri, build: impl FnOnce() -> P) -> (P, Option<Slot>) {
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        let (Some(scheme), Some(authority)) = (uri.scheme(), uri.authority()) else {
            if state.pools.is_empty() {
                state.pools.push(build());
            }
            return (state.pools[0].clone(), None);
        };
        let origin = (scheme.clone(), authority.clone());
        let State {
            pools,
            open,
            prune_at,
        } = &mut *state;
        if open.len() >= *prune_at && !open.contains_key(&origin) {
            open.retain(|_, lanes| lanes.iter().any(|n| n.load(Ordering::Acquire) > 0));
            *prune_at = (open.len() * 2).max(PRUNE_AT_LEAST);
        }
        let lanes = open.entry(origin).or_default();
        let free = lanes
            .iter()
            .position(|n| n.load(Ordering::Acquire) < self.per_connection);
        let lane = free.unwrap_or_else(|| {
            lanes.push(Arc::new(AtomicUsize::new(0)));
            lanes.len() - 1
        });
        if pools.len() <= lane {
            pools.push(build());
        }
        let count = Arc::clone(&lanes[lane]);
        count.fetch_add(1, Ordering::AcqRel);
        (pools[lane].clone(), Some(Slot(count)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn uri(s: &str) -> Uri {
        s.parse().unwrap()
    }

    /// Lanes of 2 streams per connection whose pools are numbered in the
    /// order they were built: a pick says the lane it went to.
    struct Numbered {
        lanes: Lanes<usize>,
        built: AtomicUsize,
    }

    impl Numbered {
        fn new() -> Self {
            Numbered {
                lanes: Lanes::new(2),
                built: AtomicUsize::new(0),
            }
        }

        fn pick(&self, to: &str) -> (usize, Slot) {
            let (pool, slot) = self
                .lanes
                .pick(&uri(to), || self.built.fetch_add(1, Ordering::SeqCst));
            (pool, slot.expect("an origin"))
        }
    }

    #[test]
    fn a_lane_fills_to_its_bound_then_the_next_one_opens() {
        let lanes = Numbered::new();
        let first = lanes.pick("https://p.example/v1/a");
        let second = lanes.pick("https://p.example/v1/b");
        let third = lanes.pick("https://p.example/v1/c");
        assert_eq!((first.0, second.0, third.0), (0, 0, 1));
        // A stream that ended frees its place on the first lane.
        drop(first);
        let again = [
            lanes.pick("https://p.example/"),
            lanes.pick("https://p.example/"),
            lanes.pick("https://p.example/"),
        ];
        assert_eq!(again.each_ref().map(|p| p.0), [0, 1, 2]);
        drop((second, third));
        assert_eq!(lanes.pick("https://p.example/").0, 0);
    }

    #[test]
    fn origins_count_apart_and_share_the_lanes_pools() {
        let lanes = Numbered::new();
        let _full = [
            lanes.pick("https://a.example/"),
            lanes.pick("https://a.example/"),
        ];
        // Another origin starts on the first lane: its own connection in
        // that lane's pool.
        assert_eq!(lanes.pick("https://b.example/").0, 0);
        assert_eq!(lanes.pick("http://a.example/").0, 0, "another scheme");
        let third = lanes.pick("https://a.example/");
        assert_eq!(third.0, 1);
        // The authority compares as hosts do, without case.
        let fourth = lanes.pick("https://A.EXAMPLE/");
        assert_eq!(fourth.0, 1);
        assert_eq!(lanes.pick("https://a.example/").0, 2);
    }

    #[test]
    fn origins_without_streams_are_forgotten_as_new_ones_come() {
        let lanes = Numbered::new();
        let streaming = lanes.pick("https://kept.example/");
        for n in 0..1000 {
            lanes.pick(&format!("https://o{n}.example/"));
        }
        let open = |lanes: &Numbered| lanes.lanes.state.lock().unwrap().open.len();
        assert!(open(&lanes) <= PRUNE_AT_LEAST, "{} origins", open(&lanes));
        // The origin with a stream open kept its count.
        let second = lanes.pick("https://kept.example/");
        assert_eq!(lanes.pick("https://kept.example/").0, 1);
        drop((streaming, second));
    }

    #[test]
    fn a_uri_without_an_origin_goes_to_the_first_pool_uncounted() {
        let l = Lanes::new(1);
        let (pool, slot) = l.pick(&uri("/relative"), || 7);
        assert_eq!((pool, slot.is_none()), (7, true));
        let (pool, _slot) = l.pick(&uri("https://p.example/"), || 8);
        assert_eq!(pool, 7, "the first lane's pool, built once");
    }
}

//! A stable sort for the short lists the engine orders (a body's edits, a
//! knob's list): an insertion sort, so that the standard library's sort
//! machinery (~3.5 KB) stays out of the wasm module.

/// Sorts `items` by `key`, keeping the order of items with equal keys.
/// Quadratic: meant for lists of a handful of items.
pub(crate) fn sort_by_key<T, K: PartialOrd>(items: &mut [T], key: impl Fn(&T) -> K) {
    for i in 1..items.len() {
        let mut j = i;
        while j > 0 && key(&items[j - 1]) > key(&items[j]) {
            items.swap(j - 1, j);
            j -= 1;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sorts_and_keeps_equal_keys_in_their_order() {
        let mut items = [(3, 'a'), (1, 'b'), (3, 'c'), (0, 'd'), (1, 'e')];
        sort_by_key(&mut items, |i| i.0);
        assert_eq!(items, [(0, 'd'), (1, 'b'), (1, 'e'), (3, 'a'), (3, 'c')]);
        let mut none: [u8; 0] = [];
        sort_by_key(&mut none, |i| *i);
    }
}

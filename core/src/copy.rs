//! Copies into kept buffers.

/// `into` made a copy of `from`, keeping its buffer where it has room and
/// growing it to exactly `from`'s length where not. `Vec::clone_from`
/// grows as a push does: room for four records where a report has one, in
/// every copy a report handle keeps.
pub(crate) fn exact<T: Clone>(into: &mut Vec<T>, from: &[T]) {
    into.truncate(from.len());
    into.reserve_exact(from.len() - into.len());
    let (kept, added) = from.split_at(into.len());
    into.clone_from_slice(kept);
    into.extend_from_slice(added);
}

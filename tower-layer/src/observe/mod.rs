//! `ObserveLayer`: decodes every response body as it passes and publishes the
//! evidence (progress, terminal proof, provider errors, cursor) through an
//! [`ObserveHandle`] in the response extensions.

mod body;
mod handle;
mod layer;
mod service;

pub use body::{ObserveError, ObservedBody};
pub use handle::{Observation, ObserveHandle};
pub use layer::ObserveLayer;
pub use service::Observe;

//! The admission wing: the webhook's HTTPS serving with its reloading
//! certificate (`tls`), the route (`route`), the decision on one review
//! (`review`), and the offline `check` that gives the same verdict. The
//! rules it applies (validation and the session policy) live in the base,
//! because both reconcilers apply them again; this wing is the door, and
//! imports neither reconciler.

pub mod check;
pub mod review;
pub mod route;
pub mod tls;

//! What a store crate says of itself, once: its name, the URL schemes it
//! answers to, the form of its URL, and how it opens one. The facade lists
//! the backends of its build in one place (`steadfast::BACKENDS`), and the
//! command line, error messages and bindings take their scheme names from
//! that list.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use crate::record::error::StoreError;
use crate::store::Store;

/// A store being opened.
pub type Opening<'a> =
    Pin<Box<dyn Future<Output = Result<Arc<dyn Store>, StoreError>> + Send + 'a>>;

/// Opens what follows a URL's scheme and its colon (`rest`); the scheme is
/// given too, for stores with several. `create` allows making a new store
/// (a file, a directory, a schema); without it, a missing one is
/// [`StoreError::NotFound`].
pub type OpenUrl = for<'a> fn(scheme: &'a str, rest: &'a str, create: bool) -> Opening<'a>;

/// One kind of store, as its crate declares it.
///
/// ```
/// use steadfast_core::store::{backend::Backend, memory::BACKEND};
/// assert_eq!(BACKEND.schemes, ["memory"]);
/// assert!(Backend::schemes_of(&[&BACKEND]).contains("memory:"));
/// ```
#[derive(Clone, Copy, Debug)]
#[non_exhaustive]
pub struct Backend {
    /// Its name (`sqlite`).
    pub name: &'static str,
    /// The URL schemes it opens, without the colon.
    pub schemes: &'static [&'static str],
    /// The form of its URL, for help texts (`sqlite:PATH`).
    pub url: &'static str,
    /// What it is for, in a few words.
    pub summary: &'static str,
    /// How it opens a URL.
    pub open: OpenUrl,
}

impl Backend {
    /// A backend description.
    pub const fn new(
        name: &'static str,
        schemes: &'static [&'static str],
        url: &'static str,
        summary: &'static str,
        open: OpenUrl,
    ) -> Self {
        Backend {
            name,
            schemes,
            url,
            summary,
            open,
        }
    }

    /// Whether it opens URLs of `scheme`.
    pub fn answers(&self, scheme: &str) -> bool {
        self.schemes.contains(&scheme)
    }

    /// The schemes of `backends` as a list for messages: `sqlite:, file:, memory:`.
    pub fn schemes_of(backends: &[&Backend]) -> String {
        backends
            .iter()
            .flat_map(|b| b.schemes.iter().map(|s| format!("{s}:")))
            .collect::<Vec<_>>()
            .join(", ")
    }

    /// The URL forms of `backends` as a list for help texts:
    /// `sqlite:PATH, file:PATH or memory:`.
    pub fn urls_of(backends: &[&Backend]) -> String {
        let forms: Vec<&str> = backends.iter().map(|b| b.url).collect();
        match forms.split_last() {
            Some((last, rest)) if !rest.is_empty() => format!("{} or {last}", rest.join(", ")),
            Some((last, _)) => (*last).to_string(),
            None => String::new(),
        }
    }
}

//! The metrics endpoint: `GET /metrics` over HTTP/1.1 (hyper) on `[metrics] listen`, with
//! the bounds a root daemon needs against any local user: at most [`MAX_CONNECTIONS`]
//! connections at a time (the rest wait in the kernel's backlog, costing the agent no
//! descriptor), each one request with its headers within [`HEADER_WITHIN`] and the whole
//! exchange within [`CONNECTION_WITHIN`]; a failing `accept` (out of descriptors) backs
//! off up to a second and is logged once a minute with a count, never per failure.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::{Duration, Instant};

use http_body_util::Full;
use hyper::body::Bytes;
use hyper::header::{CONTENT_TYPE, HeaderValue};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use metrics_exporter_prometheus::PrometheusHandle;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;

/// Connections served at once.
pub const MAX_CONNECTIONS: usize = 32;
/// How long a client has to send its request's headers.
pub const HEADER_WITHIN: Duration = Duration::from_secs(5);
/// How long one connection may last in all.
pub const CONNECTION_WITHIN: Duration = Duration::from_secs(10);
/// The longest wait after a failed `accept`.
const MOST_BACKOFF: Duration = Duration::from_secs(1);
/// How often failed `accept`s are logged (with their count).
const LOG_EVERY: Duration = Duration::from_secs(60);

/// Serves `handle`'s exposition on `listener` for as long as the agent runs.
pub async fn serve(listener: TcpListener, handle: PrometheusHandle) {
    let slots = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    let mut backoff = Duration::ZERO;
    let mut failures = Failures::default();
    loop {
        let Ok(slot) = Arc::clone(&slots).acquire_owned().await else { return };
        let stream = match listener.accept().await {
            Ok((stream, _)) => {
                backoff = Duration::ZERO;
                stream
            }
            Err(e) => {
                failures.note(&e);
                backoff = (backoff * 2).clamp(Duration::from_millis(10), MOST_BACKOFF);
                tokio::time::sleep(backoff).await;
                continue;
            }
        };
        let handle = handle.clone();
        tokio::spawn(async move {
            let _slot = slot;
            let service = service_fn(move |request| answer(request, handle.clone()));
            let connection = http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(HEADER_WITHIN)
                .keep_alive(false)
                .serve_connection(TokioIo::new(stream), service);
            let _ = tokio::time::timeout(CONNECTION_WITHIN, connection).await;
        });
    }
}

/// The answer to one request: the exposition for `GET /metrics`, else 404 or 405.
async fn answer(
    request: Request<hyper::body::Incoming>,
    handle: PrometheusHandle,
) -> Result<Response<Full<Bytes>>, Infallible> {
    let (status, body) = match (request.method(), request.uri().path()) {
        (&Method::GET, "/metrics") => (StatusCode::OK, handle.render() + &super::clients::render()),
        (_, "/metrics") => (StatusCode::METHOD_NOT_ALLOWED, "GET only\n".to_string()),
        _ => (StatusCode::NOT_FOUND, "the metrics are at /metrics\n".to_string()),
    };
    let mut response = Response::new(Full::new(Bytes::from(body)));
    *response.status_mut() = status;
    response
        .headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static("text/plain; version=0.0.4"));
    Ok(response)
}

/// Failed `accept`s since the last line about them.
#[derive(Default)]
struct Failures {
    count: u64,
    logged: Option<Instant>,
}

impl Failures {
    fn note(&mut self, e: &std::io::Error) {
        self.count += 1;
        if self.logged.is_none_or(|at| at.elapsed() >= LOG_EVERY) {
            tracing::warn!(
                failures = self.count,
                "the metrics endpoint cannot accept connections: {e} (backing off; logged once a minute)"
            );
            self.count = 0;
            self.logged = Some(Instant::now());
        }
    }
}

//! A cap on the controller's requests in flight to the API server, watches and the leader lease
//! excepted.
//!
//! kube's client speaks HTTP/1.1 and opens one connection per request in flight; each connection
//! keeps its TLS and HTTP buffers, about 52 KiB, for as long as it stays in the pool. Under a burst
//! the controller's reconciles alone had up to 375 connections open (docs/benchmark.md). The API
//! server answers no faster when more requests wait in it, so the controller waits here instead,
//! first come first served, and keeps few connections. Not counted: watches, which hold their
//! connection for minutes and must not wait behind a burst of writes, and the requests for the
//! leader lease, whose renewal must not either (a late renewal hands the lease over).

use std::pin::Pin;
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll, ready};

use futures::future::BoxFuture;
use http::{Request, Response};
use http_body::{Body, Frame, SizeHint};
use kube::client::ClientBuilder;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tower::{BoxError, Layer, Service};

/// How many requests the controller has in flight at most (the exempt ones aside) unless
/// configured.
pub const DEFAULT_MAX_IN_FLIGHT: u16 = 64;

/// kube's client for `config`, with at most `max_in_flight` requests in flight besides watches and
/// the leader lease's.
pub fn client(config: kube::Config, max_in_flight: u16) -> Result<kube::Client, kube::Error> {
    Ok(ClientBuilder::try_from(config)?
        .with_layer(&InFlightLimitLayer::new(max_in_flight))
        .build())
}

/// Caps the requests in flight (see the module docs).
#[derive(Clone, Debug)]
pub struct InFlightLimitLayer {
    permits: Arc<Semaphore>,
}

impl InFlightLimitLayer {
    /// At most `max_in_flight` requests (at least one) in flight besides the exempt ones.
    pub fn new(max_in_flight: u16) -> InFlightLimitLayer {
        InFlightLimitLayer {
            permits: Arc::new(Semaphore::new(usize::from(max_in_flight.max(1)))),
        }
    }
}

impl<S> Layer<S> for InFlightLimitLayer {
    type Service = InFlightLimit<S>;

    fn layer(&self, inner: S) -> InFlightLimit<S> {
        InFlightLimit {
            inner: Arc::new(Mutex::new(inner)),
            permits: self.permits.clone(),
        }
    }
}

/// The service of [`InFlightLimitLayer`]. A request waits for a permit before it reaches the
/// inner service and gives it back when its response body is dropped, that is once its connection
/// is free again.
#[derive(Debug)]
pub struct InFlightLimit<S> {
    inner: Arc<Mutex<S>>,
    permits: Arc<Semaphore>,
}

impl<S> Clone for InFlightLimit<S> {
    fn clone(&self) -> Self {
        InFlightLimit {
            inner: self.inner.clone(),
            permits: self.permits.clone(),
        }
    }
}

/// Whether `request` is a watch: `watch=true` (or `1`) in its query.
fn is_watch<B>(request: &Request<B>) -> bool {
    request
        .uri()
        .query()
        .is_some_and(|q| q.split('&').any(|p| p == "watch=true" || p == "watch=1"))
}

/// Whether `request` goes past the cap: a watch, or a request for a Lease.
fn is_exempt<B>(request: &Request<B>) -> bool {
    is_watch(request)
        || request
            .uri()
            .path()
            .starts_with("/apis/coordination.k8s.io/")
}

impl<S, ReqBody, ResBody> Service<Request<ReqBody>> for InFlightLimit<S>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>> + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Into<BoxError>,
    ReqBody: Send + 'static,
{
    type Response = Response<PermitBody<ResBody>>;
    type Error = BoxError;
    type Future = BoxFuture<'static, Result<Self::Response, BoxError>>;

    /// Always ready: a request waits for its permit in its own future, so that an exempt one
    /// never waits behind the others.
    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: Request<ReqBody>) -> Self::Future {
        let permits = (!is_exempt(&request)).then(|| self.permits.clone());
        let inner = self.inner.clone();
        Box::pin(async move {
            let permit = match permits {
                Some(permits) => Some(permits.acquire_owned().await?),
                None => None,
            };
            let mut request = Some(request);
            let response = futures::future::poll_fn(|cx| {
                let mut service = inner.lock().unwrap_or_else(PoisonError::into_inner);
                ready!(service.poll_ready(cx)).map_err(Into::into)?;
                let request = request.take().expect("a request is sent once");
                Poll::Ready(Ok::<_, BoxError>(service.call(request)))
            })
            .await?
            .await
            .map_err(Into::into)?;
            Ok(response.map(|body| PermitBody {
                body,
                _permit: permit,
            }))
        })
    }
}

/// A response body that holds its request's permit until it is dropped.
#[derive(Debug)]
pub struct PermitBody<B> {
    body: B,
    _permit: Option<OwnedSemaphorePermit>,
}

impl<B: Body + Unpin> Body for PermitBody<B> {
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        Pin::new(&mut self.body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::Duration;

    use http_body_util::{BodyExt, Full};
    use tower::ServiceExt;

    use super::*;

    type TestBody = Full<bytes::Bytes>;

    /// A service that answers after `delay` and records how many requests it had at once.
    #[derive(Clone, Default)]
    struct Counting {
        now: Arc<AtomicUsize>,
        most: Arc<AtomicUsize>,
    }

    impl Service<Request<()>> for Counting {
        type Response = Response<TestBody>;
        type Error = BoxError;
        type Future = BoxFuture<'static, Result<Response<TestBody>, BoxError>>;

        fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
            Poll::Ready(Ok(()))
        }

        fn call(&mut self, request: Request<()>) -> Self::Future {
            let (now, most) = (self.now.clone(), self.most.clone());
            Box::pin(async move {
                let at_once = now.fetch_add(1, Ordering::SeqCst) + 1;
                most.fetch_max(at_once, Ordering::SeqCst);
                if !is_watch(&request) {
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
                now.fetch_sub(1, Ordering::SeqCst);
                Ok(Response::new(Full::new(bytes::Bytes::from_static(b"{}"))))
            })
        }
    }

    fn get(uri: &str) -> Request<()> {
        Request::get(uri).body(()).expect("request")
    }

    #[tokio::test]
    async fn at_most_the_cap_is_in_flight_until_each_body_is_dropped() {
        let counting = Counting::default();
        let service = InFlightLimitLayer::new(4).layer(counting.clone());
        let bodies = Arc::new(AtomicUsize::new(0));
        let calls = (0..64).map(|_| {
            let service = service.clone();
            let bodies = bodies.clone();
            async move {
                let response = service
                    .oneshot(get("/api/v1/pods"))
                    .await
                    .expect("response");
                let held = bodies.fetch_add(1, Ordering::SeqCst) + 1;
                tokio::time::sleep(Duration::from_millis(2)).await;
                let body = response.into_body().collect().await.expect("body");
                bodies.fetch_sub(1, Ordering::SeqCst);
                assert!(held <= 4, "{held} bodies held at once with a cap of 4");
                body.to_bytes()
            }
        });
        let answers = futures::future::join_all(calls).await;
        assert!(answers.iter().all(|b| b.as_ref() == b"{}"));
        assert_eq!(counting.most.load(Ordering::SeqCst), 4);
    }

    #[tokio::test]
    async fn watches_and_leases_are_not_counted_and_do_not_wait() {
        let service = InFlightLimitLayer::new(1).layer(Counting::default());
        let held = service
            .clone()
            .oneshot(get("/api/v1/pods"))
            .await
            .expect("a request");
        let exempt = [
            "/api/v1/pods?watch=true",
            "/api/v1/pods?labelSelector=a&watch=1",
            "/apis/coordination.k8s.io/v1/namespaces/agentrun/leases/agentrun-controller",
        ]
        .map(|uri| tokio::time::timeout(Duration::from_secs(5), service.clone().oneshot(get(uri))));
        for answer in futures::future::join_all(exempt).await {
            answer
                .expect("an exempt request does not wait")
                .expect("an answer");
        }
        let blocked = tokio::time::timeout(
            Duration::from_millis(50),
            service.clone().oneshot(get("/api")),
        )
        .await;
        assert!(blocked.is_err(), "a second request waits for the first");
        drop(held);
        tokio::time::timeout(Duration::from_secs(5), service.oneshot(get("/api")))
            .await
            .expect("the permit came back with the body")
            .expect("a request");
    }

    #[test]
    fn only_the_watch_parameter_makes_a_watch() {
        assert!(is_watch(&get("/api/v1/pods?watch=true&resourceVersion=1")));
        assert!(is_watch(&get("/api/v1/pods?watch=1")));
        assert!(!is_watch(&get("/api/v1/pods")));
        assert!(!is_watch(&get("/api/v1/pods?watch=false")));
        assert!(!is_watch(&get("/api/v1/pods?labelSelector=watch%3Dtrue")));
        assert!(!is_watch(&get("/api/v1/namespaces/watch=true/pods")));
    }
}

//! Load shedding: at most N requests are handled at once; beyond that a call is answered at once
//! with RESOURCE_EXHAUSTED instead of queueing without bound. Health checks are exempt so probes
//! keep working under load. A streaming call holds its slot only until its response starts.

use std::{
    future::Future,
    pin::Pin,
    sync::Arc,
    task::{Context, Poll},
};

use tokio::sync::Semaphore;
use tower::{Layer, Service};

/// Default bound on concurrently handled requests per service.
pub const DEFAULT_MAX_IN_FLIGHT: usize = 1024;

#[derive(Debug, Clone)]
pub struct LoadShedLayer {
    permits: Arc<Semaphore>,
}

impl LoadShedLayer {
    pub fn new(max_in_flight: usize) -> Self {
        Self {
            permits: Arc::new(Semaphore::new(max_in_flight.max(1))),
        }
    }
}

impl<S> Layer<S> for LoadShedLayer {
    type Service = LoadShed<S>;

    fn layer(&self, inner: S) -> Self::Service {
        LoadShed {
            inner,
            permits: self.permits.clone(),
        }
    }
}

#[derive(Debug, Clone)]
pub struct LoadShed<S> {
    inner: S,
    permits: Arc<Semaphore>,
}

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;

impl<S, B, RB> Service<http::Request<B>> for LoadShed<S>
where
    S: Service<http::Request<B>, Response = http::Response<RB>>,
    S::Future: Send + 'static,
    RB: Default + Send + 'static,
{
    type Response = http::Response<RB>;
    type Error = S::Error;
    type Future = BoxFuture<Result<Self::Response, Self::Error>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: http::Request<B>) -> Self::Future {
        if req.uri().path().starts_with("/grpc.health.v1.") {
            return Box::pin(self.inner.call(req));
        }
        match self.permits.clone().try_acquire_owned() {
            Ok(permit) => {
                let fut = self.inner.call(req);
                Box::pin(async move {
                    let response = fut.await;
                    drop(permit);
                    response
                })
            }
            Err(_) => Box::pin(async {
                Ok(tonic::Status::resource_exhausted(
                    "server is at its concurrency limit; retry with backoff",
                )
                .into_http())
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::convert::Infallible;

    /// Answers once the test adds a permit to its gate.
    #[derive(Clone)]
    struct Gated(Arc<Semaphore>);

    impl Service<http::Request<()>> for Gated {
        type Response = http::Response<String>;
        type Error = Infallible;
        type Future = BoxFuture<Result<Self::Response, Infallible>>;

        fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
            Poll::Ready(Ok(()))
        }

        fn call(&mut self, _: http::Request<()>) -> Self::Future {
            let gate = self.0.clone();
            Box::pin(async move {
                gate.acquire().await.unwrap().forget();
                Ok(http::Response::new("ok".to_string()))
            })
        }
    }

    fn req(path: &str) -> http::Request<()> {
        http::Request::builder().uri(path).body(()).unwrap()
    }

    fn grpc_status(r: &http::Response<String>) -> Option<String> {
        r.headers()
            .get("grpc-status")
            .map(|v| v.to_str().unwrap().to_string())
    }

    #[tokio::test]
    async fn beyond_the_limit_calls_are_shed_with_resource_exhausted_and_health_is_exempt() {
        let gate = Arc::new(Semaphore::new(0));
        let mut svc = LoadShedLayer::new(1).layer(Gated(gate.clone()));
        // The slot is taken when the call is made, before its future runs.
        let first = tokio::spawn(svc.call(req("/arbor.runner.v1.RunnerService/GetRun")));
        let shed = svc
            .call(req("/arbor.runner.v1.RunnerService/GetRun"))
            .await
            .unwrap();
        assert_eq!(
            grpc_status(&shed).as_deref(),
            Some("8"),
            "RESOURCE_EXHAUSTED"
        );
        let health = tokio::spawn(svc.call(req("/grpc.health.v1.Health/Check")));
        gate.add_permits(2);
        assert_eq!(grpc_status(&first.await.unwrap().unwrap()), None);
        assert_eq!(grpc_status(&health.await.unwrap().unwrap()), None);
        let after = tokio::spawn(svc.call(req("/arbor.runner.v1.RunnerService/GetRun")));
        gate.add_permits(1);
        assert_eq!(
            grpc_status(&after.await.unwrap().unwrap()),
            None,
            "the slot came back"
        );
    }
}

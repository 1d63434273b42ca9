//! Where the library's spans and events go: stderr (`-v`, or
//! `STEADFAST_LOG=LEVEL`), and with the `otel` feature an OpenTelemetry
//! collector over OTLP/HTTP when the standard `OTEL_EXPORTER_OTLP_ENDPOINT`
//! or `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` variable is set (with
//! `OTEL_EXPORTER_OTLP_PROTOCOL`, `OTEL_EXPORTER_OTLP_HEADERS`,
//! `OTEL_SERVICE_NAME` and the rest read as the OpenTelemetry SDK reads
//! them; `OTEL_SDK_DISABLED=true` turns it off).

use tracing_subscriber::filter::LevelFilter;
use tracing_subscriber::fmt::format::FmtSpan;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::Layer;

/// Keeps the exporter alive; dropping it sends what is left.
pub struct Telemetry {
    #[cfg(feature = "otel")]
    provider: Option<opentelemetry_sdk::trace::SdkTracerProvider>,
}

impl Drop for Telemetry {
    fn drop(&mut self) {
        #[cfg(feature = "otel")]
        if let Some(p) = self.provider.take() {
            if let Err(e) = p.shutdown() {
                crate::output::note(format_args!(
                    "steadfast: could not send the last spans to the OpenTelemetry collector: {e}"
                ));
            }
        }
    }
}

/// The level of stderr output: `-v` shows the run and step spans as they
/// close (with their times), `-vv` also every store call, `-vvv` all;
/// without `-v`, `STEADFAST_LOG` names a level for events only.
fn stderr_level(verbose: u8) -> (LevelFilter, bool) {
    match verbose {
        0 => (
            std::env::var("STEADFAST_LOG")
                .ok()
                .and_then(|l| l.parse::<LevelFilter>().ok())
                .unwrap_or(LevelFilter::OFF),
            false,
        ),
        1 => (LevelFilter::INFO, true),
        2 => (LevelFilter::DEBUG, true),
        _ => (LevelFilter::TRACE, true),
    }
}

/// Sets up the subscriber for this process.
pub fn init(verbose: u8) -> Telemetry {
    let (level, spans) = stderr_level(verbose);
    let stderr = (level != LevelFilter::OFF).then(|| {
        tracing_subscriber::fmt::layer()
            .with_writer(std::io::stderr)
            .without_time()
            .with_span_events(if spans { FmtSpan::CLOSE } else { FmtSpan::NONE })
            .with_filter(level)
    });
    #[cfg(feature = "otel")]
    {
        let (otel, provider) = match otel_provider() {
            Some(p) => {
                use opentelemetry::trace::TracerProvider;
                let tracer = p.tracer("steadfast");
                let layer = tracing_opentelemetry::layer()
                    .with_tracer(tracer)
                    .with_filter(tracing_subscriber::filter::filter_fn(|m| {
                        m.target().starts_with("steadfast") && *m.level() <= tracing::Level::DEBUG
                    }));
                (Some(layer), Some(p))
            }
            None => (None, None),
        };
        let _ = tracing_subscriber::registry()
            .with(stderr)
            .with(otel)
            .try_init();
        Telemetry { provider }
    }
    #[cfg(not(feature = "otel"))]
    {
        let _ = tracing_subscriber::registry().with(stderr).try_init();
        Telemetry {}
    }
}

/// A tracer provider exporting over OTLP/HTTP, when the environment names a
/// collector.
#[cfg(feature = "otel")]
fn otel_provider() -> Option<opentelemetry_sdk::trace::SdkTracerProvider> {
    let set = |v: &str| std::env::var(v).is_ok_and(|s| !s.trim().is_empty());
    if !(set("OTEL_EXPORTER_OTLP_ENDPOINT") || set("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"))
        || std::env::var("OTEL_SDK_DISABLED").is_ok_and(|v| v.eq_ignore_ascii_case("true"))
    {
        return None;
    }
    use opentelemetry_otlp::WithExportConfig;
    let exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_http()
        .with_protocol(protocol())
        .build();
    let exporter = match exporter {
        Ok(e) => e,
        Err(e) => {
            crate::output::note(format_args!(
                "steadfast: the OpenTelemetry exporter cannot start ({e}); no spans are sent"
            ));
            return None;
        }
    };
    let resource = opentelemetry_sdk::Resource::builder()
        .with_service_name(
            std::env::var("OTEL_SERVICE_NAME").unwrap_or_else(|_| "steadfast".into()),
        )
        .build();
    Some(
        opentelemetry_sdk::trace::SdkTracerProvider::builder()
            .with_batch_exporter(exporter)
            .with_resource(resource)
            .build(),
    )
}

/// `OTEL_EXPORTER_OTLP_PROTOCOL` (`http/protobuf`, the default, or
/// `http/json`).
#[cfg(feature = "otel")]
fn protocol() -> opentelemetry_otlp::Protocol {
    match std::env::var("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL")
        .or_else(|_| std::env::var("OTEL_EXPORTER_OTLP_PROTOCOL"))
        .as_deref()
    {
        Ok("http/json") => opentelemetry_otlp::Protocol::HttpJson,
        _ => opentelemetry_otlp::Protocol::HttpBinary,
    }
}

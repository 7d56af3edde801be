//! Command line: `serve` (the default command) runs the daemon; `translate` converts a recorded legacy stream.

use std::io::{self, Read, Write};
use std::path::PathBuf;
use std::process::ExitCode;

use clap::builder::{PossibleValuesParser, TypedValueParser};
use clap::{Args, Parser, Subcommand};
use serde::de::value::{Error as SerdeError, StrDeserializer};
use serde::de::{DeserializeOwned, Error as _, Visitor};
use serde::Deserializer;

use crate::config::{redact_userinfo, ConfigError, Overrides, Settings};
use crate::demo::{self, DemoDialect};
use crate::proxy::accept::server::{banner, Gateway};
use crate::telemetry;
use crate::translate::{self, Dialect, Translator};

/// Exit status for a configuration or usage error.
pub const EXIT_CONFIG: u8 = 2;
/// Bytes read from the input per `feed` in `translate`.
const TRANSLATE_CHUNK: usize = 64 << 10;

#[derive(Debug, Parser)]
#[command(
    name = "sse-gateway",
    version,
    about = "Reverse proxy translating legacy XML-in-SSE agent streams into JSON envelopes.",
    args_conflicts_with_subcommands = true
)]
pub struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
    #[command(flatten)]
    serve: ServeArgs,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run the gateway (the default command).
    Serve(ServeArgs),
    /// Translate a recorded legacy stream (FILE, or stdin) to the JSON envelope stream on stdout.
    Translate(TranslateArgs),
}

#[derive(Debug, Clone, Default, Args)]
pub struct ServeArgs {
    /// TOML config file, layered over config/default.toml.
    #[arg(long, value_name = "FILE")]
    config: Option<PathBuf>,
    /// Upstream base URL (http://host:port[/prefix]); none starts the built-in demo backend (an empty one is refused).
    #[arg(long, value_name = "URL")]
    upstream: Option<String>,
    /// Public listen address [default: 0.0.0.0:8080].
    #[arg(long, value_name = "ADDR")]
    listen: Option<String>,
    /// Admin listen address for /metrics, /healthz, /readyz [default: 127.0.0.1:9090].
    #[arg(long, value_name = "ADDR")]
    admin_listen: Option<String>,
    /// Validate the configuration, print the effective configuration and exit.
    #[arg(long)]
    check_config: bool,
    /// Start the built-in demo backend on loopback and use it as the upstream.
    #[arg(long)]
    demo: bool,
    /// The demo backend's dialect: the legacy stream, cogency 3.3 events or Agent SDK messages (with --demo or
    /// no upstream).
    #[arg(long, value_name = "DIALECT", default_value = "xml", value_parser = serde_enum::<DemoDialect>())]
    demo_dialect: DemoDialect,
}

#[derive(Debug, Args)]
struct TranslateArgs {
    /// Recorded legacy stream; stdin when absent or "-".
    file: Option<PathBuf>,
    /// Upstream dialect (auto tells them apart from the first event).
    #[arg(long, default_value = "auto", value_parser = serde_enum::<Dialect>())]
    dialect: Dialect,
    /// Agent id used until the stream's meta_init names one [default: a fresh UUID].
    #[arg(long, value_name = "ID")]
    agent_id: Option<String>,
    /// Max bytes of one envelope's JSON object.
    #[arg(long, value_name = "BYTES", default_value_t = translate::DEFAULT_BUDGET)]
    budget: usize,
}

/// A value parser for a core enum (the core does not depend on clap): its serde names are the possible values.
fn serde_enum<T: DeserializeOwned + Clone + Send + Sync + 'static>() -> impl TypedValueParser<Value = T> {
    PossibleValuesParser::new(variant_names::<T>())
        .try_map(|name| T::deserialize(StrDeserializer::<SerdeError>::new(&name)))
}

/// The names serde gives `T`'s variants, in declaration order: caught from the `deserialize_enum` call of its
/// derived `Deserialize`.
fn variant_names<T: DeserializeOwned>() -> &'static [&'static str] {
    struct Catch<'a>(&'a mut &'static [&'static str]);
    impl<'de> Deserializer<'de> for Catch<'_> {
        type Error = SerdeError;
        fn deserialize_any<V: Visitor<'de>>(self, _: V) -> Result<V::Value, SerdeError> {
            Err(SerdeError::custom("not an enum"))
        }
        fn deserialize_enum<V: Visitor<'de>>(
            self,
            _: &'static str,
            variants: &'static [&'static str],
            _: V,
        ) -> Result<V::Value, SerdeError> {
            *self.0 = variants;
            Err(SerdeError::custom("caught"))
        }
        serde::forward_to_deserialize_any! {
            bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string bytes byte_buf option unit
            unit_struct newtype_struct seq tuple tuple_struct map struct identifier ignored_any
        }
    }
    let mut names: &'static [&'static str] = &[];
    let _ = T::deserialize(Catch(&mut names));
    names
}

/// Entry point of the binary.
pub fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Some(Command::Translate(args)) => run_translate(&args),
        Some(Command::Serve(args)) => run_serve(&args),
        None => run_serve(&cli.serve),
    }
}

fn run_serve(args: &ServeArgs) -> ExitCode {
    let overrides = Overrides {
        config_file: args.config.clone(),
        upstream: args.upstream.clone(),
        listen: args.listen.clone(),
        admin_listen: args.admin_listen.clone(),
    };
    let mut settings = match Settings::load(&overrides) {
        Ok(s) => s,
        Err(e) => return config_error(&e),
    };
    // The standard OTEL_* variables are configuration too: a bad one refuses the start, naming it.
    let env: std::collections::HashMap<String, String> = std::env::vars().collect();
    if let Err(e) = crate::proxy::trace::settings::read(&env, &settings.telemetry) {
        eprintln!("sse-gateway: invalid configuration: {e}");
        return ExitCode::from(EXIT_CONFIG);
    }
    if args.check_config {
        print!("{}", settings.to_toml());
        return ExitCode::SUCCESS;
    }
    telemetry::init_tracing(&settings.log);
    let runtime = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(r) => r,
        Err(e) => return failure(format_args!("cannot start the runtime: {e}")),
    };
    let demo_mode = args.demo || settings.upstream.url.is_empty();
    if demo_mode {
        settings.server.listen = settings.demo_listen();
        if settings.frontends.is_empty() {
            // A newcomer points a `useChat` app or an AG-UI agent at the demo as it is.
            settings.frontends = demo::frontends();
        }
    }
    runtime.block_on(async move {
        if demo_mode {
            match demo::start(args.demo_dialect).await {
                Ok(addr) => {
                    settings.upstream.url = format!("http://{addr}");
                    let dialect = args.demo_dialect.dialect();
                    tracing::warn!(
                        upstream = %settings.upstream.url,
                        listen = %settings.server.listen,
                        dialect = dialect.as_str(),
                        "DEMO MODE: the upstream is the built-in demo backend, not a real upstream; every answer is \
                         canned demo output (set upstream.url or --upstream to proxy a backend)"
                    );
                }
                Err(e) => return failure(format_args!("cannot start the demo backend: {e}")),
            }
        }
        let gateway = match Gateway::bind(settings.clone(), prometheus::Registry::new()).await {
            Ok(g) => g,
            Err(e) => return failure(e),
        };
        println!("{}", banner(gateway.local_addr(), gateway.admin_addr()));
        if demo_mode {
            println!("{}", demo::instructions(gateway.local_addr(), args.demo_dialect));
            let configured = settings.translate.options.dialect;
            if !args.demo_dialect.read_by(configured) {
                tracing::warn!(
                    "translate.dialect = {} does not read the demo's {} stream: its requests get error envelopes \
                     unless they send X-Stream-Dialect: {}",
                    configured.as_str(),
                    args.demo_dialect.dialect().as_str(),
                    args.demo_dialect.dialect().as_str(),
                );
            }
        }
        tracing::info!(
            listen = %gateway.local_addr(),
            admin = %gateway.admin_addr(),
            upstream = %redact_userinfo(&settings.upstream.url),
            "started"
        );
        gateway.run(shutdown_signal()).await;
        tracing::info!("stopped");
        ExitCode::SUCCESS
    })
}

/// Says why the command failed; exit status 1.
fn failure(why: impl std::fmt::Display) -> ExitCode {
    eprintln!("sse-gateway: {why}");
    ExitCode::FAILURE
}

fn config_error(e: &ConfigError) -> ExitCode {
    eprintln!("sse-gateway: invalid configuration: {e}");
    ExitCode::from(EXIT_CONFIG)
}

/// Resolves on SIGTERM or SIGINT.
async fn shutdown_signal() {
    #[cfg(unix)]
    let terminate = async {
        use tokio::signal::unix::{signal, SignalKind};
        match signal(SignalKind::terminate()) {
            Ok(mut term) => {
                term.recv().await;
            }
            Err(_) => std::future::pending().await,
        }
    };
    #[cfg(not(unix))]
    let terminate = std::future::pending::<()>();
    tokio::select! {
        () = terminate => {},
        _ = tokio::signal::ctrl_c() => {},
    }
    tracing::info!("shutdown signal received");
}

fn run_translate(args: &TranslateArgs) -> ExitCode {
    if args.budget < translate::MIN_BUDGET {
        eprintln!(
            "sse-gateway: --budget {} is below the minimum {}",
            args.budget,
            translate::MIN_BUDGET
        );
        return ExitCode::from(EXIT_CONFIG);
    }
    let opts = translate::Options {
        budget: args.budget,
        dialect: args.dialect,
        ..translate::Options::default()
    };
    let agent = args
        .agent_id
        .clone()
        .unwrap_or_else(|| uuid::Uuid::new_v4().to_string());
    let input: Box<dyn Read> = match &args.file {
        Some(p) if p.as_os_str() != "-" => match std::fs::File::open(p) {
            Ok(f) => Box::new(f),
            Err(e) => return failure(format_args!("cannot read {}: {e}", p.display())),
        },
        _ => Box::new(io::stdin().lock()),
    };
    match translate_stream(opts, &agent, input, &mut io::stdout().lock()) {
        Ok(()) => ExitCode::SUCCESS,
        // `sse-gateway translate log.sse | head` is not a failure.
        Err(e) if e.kind() == io::ErrorKind::BrokenPipe => ExitCode::SUCCESS,
        Err(e) => failure(format_args!("translate: {e}")),
    }
}

/// Feeds `input` to a translator chunk by chunk, writing each chunk's envelopes as soon as they exist.
pub fn translate_stream(
    opts: translate::Options,
    agent: &str,
    mut input: impl Read,
    output: &mut impl Write,
) -> io::Result<()> {
    let mut t = Translator::new(opts, agent);
    let mut buf = vec![0u8; TRANSLATE_CHUNK];
    let mut out = Vec::with_capacity(TRANSLATE_CHUNK * 2);
    loop {
        let n = match input.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        t.feed(&buf[..n], &mut out);
        if !out.is_empty() {
            output.write_all(&out)?;
            output.flush()?;
            out.clear();
        }
    }
    t.finish(&mut out);
    output.write_all(&out)?;
    output.flush()
}

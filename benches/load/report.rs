//! Output of the harness: markdown tables on stdout (and optionally a file), number formatting, the gnuplot plot.

use std::fmt::Write as _;
use std::path::Path;
use std::process::Command;

use hdrhistogram::Histogram;

/// Collects the report while printing it.
#[derive(Default)]
pub struct Report {
    pub text: String,
}

impl Report {
    pub fn line(&mut self, s: impl AsRef<str>) {
        println!("{}", s.as_ref());
        let _ = writeln!(self.text, "{}", s.as_ref());
    }
}

/// Nanoseconds as microseconds, one decimal.
pub fn us(ns: f64) -> String {
    format!("{:.1}", ns / 1000.0)
}

/// A quantile of a histogram in ns (0 when empty).
pub fn q(h: &Histogram<u64>, quantile: f64) -> f64 {
    if h.is_empty() {
        0.0
    } else {
        h.value_at_quantile(quantile) as f64
    }
}

pub fn ms(ns: f64) -> String {
    format!("{:.2}", ns / 1e6)
}

/// Thousands separators for counts.
pub fn n(v: f64) -> String {
    let s = format!("{:.0}", v);
    let neg = s.starts_with('-');
    let digits = s.trim_start_matches('-');
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(c);
    }
    if neg {
        format!("-{out}")
    } else {
        out
    }
}

pub fn verdict(met: bool) -> &'static str {
    if met {
        "MET"
    } else {
        "MISSED"
    }
}

/// Renders the scaling plot with gnuplot: `dat` has one row per stream count; per target, three columns
/// (p50 µs, p99 µs, events/s) in the order of `names`.
pub fn plot(dat: &Path, png: &Path, names: &[&str], title: &str) -> Result<(), String> {
    let d = dat.display();
    let mut s = String::new();
    let _ = writeln!(s, "set terminal pngcairo size 1500,620 font 'DejaVu Sans,11'");
    let _ = writeln!(s, "set output '{}'", png.display());
    let _ = writeln!(s, "set multiplot layout 1,2 title '{title}'");
    let _ = writeln!(s, "set logscale x; set grid; set key top left; set xrange [0.7:14000]");
    let _ = writeln!(s, "set xlabel 'concurrent streams'");
    let _ = writeln!(
        s,
        "set logscale y; set ylabel 'per-event latency, upstream send to client receive (µs)'"
    );
    let _ = writeln!(
        s,
        "set title 'Latency: p50 solid, p99 dashed (offered: 100 ev/s per stream, at most 10k ev/s in all)'"
    );
    let mut parts = Vec::new();
    for (i, name) in names.iter().enumerate() {
        let c = 2 + 3 * i;
        parts.push(format!("'{d}' u 1:{c} w lp lw 2 pt 7 lc {} dt 1 t '{name} p50'", i + 1));
        parts.push(format!(
            "'{d}' u 1:{} w lp lw 2 pt 6 lc {} dt 2 t '{name} p99'",
            c + 1,
            i + 1
        ));
    }
    let _ = writeln!(s, "plot {}", parts.join(", "));
    let _ = writeln!(
        s,
        "set ylabel 'events/s delivered at saturation'; set logscale y; set key bottom left"
    );
    let _ = writeln!(s, "set title 'Throughput at saturation (all processes share 2 cores)'");
    let mut parts = Vec::new();
    for (i, name) in names.iter().enumerate() {
        parts.push(format!(
            "'{d}' u 1:{} w lp lw 2 pt 7 lc {} t '{name}'",
            4 + 3 * i,
            i + 1
        ));
    }
    let _ = writeln!(s, "plot {}", parts.join(", "));
    let _ = writeln!(s, "unset multiplot");
    let gp = dat.with_extension("gp");
    std::fs::write(&gp, s).map_err(|e| e.to_string())?;
    let st = Command::new("gnuplot")
        .arg(&gp)
        .status()
        .map_err(|e| format!("gnuplot: {e} (apt-get install -y gnuplot-nox)"))?;
    if st.success() {
        Ok(())
    } else {
        Err(format!("gnuplot exited with {st}"))
    }
}

/// The median of `v` (the mean of the middle two for an even count; 0 for none).
/// The first three failures, for a report line.
pub fn first_failures(failures: &[String]) -> String {
    failures.iter().take(3).cloned().collect::<Vec<_>>().join(" | ")
}

/// Reports `failures` of readers (`what`: which phase) as a failed run; nothing when there are none.
pub fn readers_failed(rep: &mut Report, ok: &mut bool, failures: &[String], what: &str) {
    if failures.is_empty() {
        return;
    }
    *ok = false;
    rep.line(format!(
        "**{} readers FAILED{what}**; first: {}\n",
        failures.len(),
        first_failures(failures)
    ));
}

pub fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    match v.len() {
        0 => 0.0,
        k if k % 2 == 1 => v[k / 2],
        k => (v[k / 2 - 1] + v[k / 2]) / 2.0,
    }
}

/// The median over rounds of (`v` / `base` in the same round): the ratio of two interleaved targets.
pub fn round_ratio(v: &[f64], base: &[f64]) -> f64 {
    median(v.iter().zip(base).map(|(a, b)| a / b.max(f64::MIN_POSITIVE)).collect())
}

/// A row's ratio cell against the first row (`i` = 0: `1.00`).
pub fn ratio_cell(i: usize, v: &[f64], base: &[f64]) -> String {
    if i == 0 {
        "1.00".to_owned()
    } else {
        format!("**{:.3}×**", round_ratio(v, base))
    }
}

/// Each round's value with `digits` decimals, comma-separated.
pub fn by_round(v: &[f64], digits: usize) -> String {
    v.iter().map(|x| format!("{x:.digits$}")).collect::<Vec<_>>().join(", ")
}

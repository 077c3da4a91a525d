//! What the PNG plots share: the font for their text, the provenance footer, the palette, the markers and the
//! legend drawn beside the data ([`side_legend`]).

use plotters::chart::ChartContext;
use plotters::drawing::DrawingAreaErrorKind;
use plotters::prelude::{Cartesian2d, Circle, DrawingBackend, PathElement, Ranged, BLACK, WHITE};
use plotters::style::{Color, FontStyle, IntoFont, RGBAColor, RGBColor};

/// Registers a TrueType font for the plots' text (plotters draws text with
/// ab_glyph from a registered font; the usual DejaVu and Liberation
/// locations are tried, e.g. Debian's `fonts-dejavu-core`). False if none
/// was found: plots that need text then say so, the others go without.
pub(crate) fn register_font() -> bool {
    const FONTS: &[&str] = &[
        "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf",
        "/usr/share/fonts/dejavu/DejaVuSans.ttf",
        "/usr/share/fonts/TTF/DejaVuSans.ttf",
        "/usr/share/fonts/truetype/liberation/LiberationSans-Regular.ttf",
    ];
    let Some(bytes) = FONTS.iter().find_map(|p| std::fs::read(p).ok()) else {
        return false;
    };
    // The registry keeps fonts for the process's life.
    let bytes: &'static [u8] = Box::leak(bytes.into_boxed_slice());
    plotters::style::register_font("sans-serif", FontStyle::Normal, bytes).is_ok()
}

/// The provenance line every plot carries at its foot (set once by the CLI: version, commit, machine, date, command).
static FOOTER: std::sync::OnceLock<String> = std::sync::OnceLock::new();

/// Sets the plots' provenance footer (the first call wins).
pub fn set_footer(line: String) {
    let _ = FOOTER.set(line);
}

/// Draws the provenance footer at the bottom left of `area` (nothing when unset or without a font).
pub(crate) fn footer<DB: DrawingBackend>(
    area: &plotters::drawing::DrawingArea<DB, plotters::coord::Shift>,
    text: bool,
) -> Result<(), DrawingAreaErrorKind<DB::ErrorType>> {
    let Some(line) = FOOTER.get().filter(|_| text) else { return Ok(()) };
    let (_, h) = area.dim_in_pixel();
    let style = ("sans-serif", 12).into_font().color(&RGBColor(90, 90, 90));
    // Long command lines are cut: the JSON report carries the whole provenance.
    let shown: String = line.chars().take(220).collect();
    area.draw(&plotters::element::Text::new(shown, (8, h as i32 - 16), style))
}

/// How a [`side_legend`] entry's sample is drawn.
#[derive(Clone, Copy)]
pub(crate) enum Sample {
    /// A solid line with a filled circle (a measured series).
    Series(RGBColor),
    /// A solid line with a filled triangle (a series past the palette's first cycle, or a second kind of point).
    SeriesTriangle(RGBColor),
    /// A solid line alone.
    Line(RGBColor),
    /// A dashed line (long dashes).
    Dashed(RGBColor),
    /// A dotted line (short dashes).
    Dotted(RGBColor),
    /// A filled square (a bar).
    Bar(RGBColor),
    /// A hollow circle: a flagged figure.
    Hollow,
    /// A vertical stroke: min-max over `--reps`.
    Range,
    /// No sample: a heading for the entries below it.
    Heading,
}

/// Draws a legend in its own area beside the plot (never over the data): one entry per row, sample then label.
pub(crate) fn side_legend<DB: DrawingBackend>(
    area: &plotters::drawing::DrawingArea<DB, plotters::coord::Shift>,
    entries: &[(Sample, String)],
) -> Result<(), DrawingAreaErrorKind<DB::ErrorType>> {
    use plotters::element::{DashedPathElement, Rectangle, Text, TriangleMarker};
    for (k, (sample, label)) in entries.iter().enumerate() {
        let y = 40 + 22 * k as i32;
        let line = |c: RGBColor| PathElement::new(vec![(10, y), (44, y)], c.stroke_width(2));
        match *sample {
            Sample::Series(c) => {
                area.draw(&line(c))?;
                area.draw(&Circle::new((27, y), 5, c.filled()))?;
            }
            Sample::SeriesTriangle(c) => {
                area.draw(&line(c))?;
                area.draw(&TriangleMarker::new((27, y), 7, c.filled()))?;
            }
            Sample::Line(c) => area.draw(&line(c))?,
            Sample::Dashed(c) => area.draw(&DashedPathElement::new(vec![(10, y), (44, y)], 9, 5, c.stroke_width(2)))?,
            Sample::Dotted(c) => area.draw(&DashedPathElement::new(vec![(10, y), (44, y)], 3, 4, c.stroke_width(2)))?,
            Sample::Bar(c) => area.draw(&Rectangle::new([(20, y - 6), (34, y + 6)], c.filled()))?,
            Sample::Hollow => area.draw(&Circle::new((27, y), 5, BLACK.stroke_width(2)))?,
            Sample::Range => area.draw(&PathElement::new(vec![(27, y - 7), (27, y + 7)], BLACK.stroke_width(2)))?,
            Sample::Heading => {}
        }
        let x = if matches!(sample, Sample::Heading) { 10 } else { 52 };
        area.draw(&Text::new(label.clone(), (x, y - 8), ("sans-serif", 15)))?;
    }
    Ok(())
}

/// One measured point of a series: a filled circle when its row is
/// trusted, a hollow one when flagged, and with `--reps` a bar from the
/// smallest to the largest repetition.
pub(crate) struct Mark {
    pub(crate) x: f64,
    pub(crate) y: f64,
    pub(crate) bar: Option<(f64, f64)>,
    pub(crate) ok: bool,
}

/// Draws `marks` in `color` (see [`Mark`]), as triangles instead of circles with `triangle` (a series past the
/// palette's first cycle, [`marker_triangle`]).
pub(crate) fn marks<'a, DB: DrawingBackend + 'a, X: Ranged<ValueType = f64>, Y: Ranged<ValueType = f64>>(
    chart: &mut ChartContext<'a, DB, Cartesian2d<X, Y>>,
    marks: &[Mark],
    color: RGBAColor,
    triangle: bool,
) -> Result<(), DrawingAreaErrorKind<DB::ErrorType>> {
    use plotters::element::TriangleMarker;
    for m in marks {
        let style = if m.ok { color.filled() } else { WHITE.filled() };
        if triangle {
            chart.draw_series([TriangleMarker::new((m.x, m.y), 7, style)])?;
            chart.draw_series([TriangleMarker::new((m.x, m.y), 7, color.stroke_width(2))])?;
        } else {
            chart.draw_series([Circle::new((m.x, m.y), 5, style)])?;
            chart.draw_series([Circle::new((m.x, m.y), 5, color.stroke_width(2))])?;
        }
    }
    chart.draw_series(
        marks
            .iter()
            .filter_map(|m| m.bar.map(|(lo, hi)| PathElement::new(vec![(m.x, lo), (m.x, hi)], color.stroke_width(1)))),
    )?;
    Ok(())
}

/// The caption's note when a plot has flagged points.
pub(crate) fn flagged_note(any: bool) -> &'static str {
    if any {
        " (hollow: flagged, see the table)"
    } else {
        ""
    }
}

/// The Okabe-Ito palette: eight colours told apart with every common colour-vision deficiency (black first).
pub(crate) const PALETTE: [RGBColor; 8] = [
    RGBColor(0, 0, 0),
    RGBColor(230, 159, 0),
    RGBColor(86, 180, 233),
    RGBColor(0, 158, 115),
    RGBColor(240, 228, 66),
    RGBColor(0, 114, 178),
    RGBColor(213, 94, 0),
    RGBColor(204, 121, 167),
];

/// Series `i`'s colour (the palette cycles; [`marker_triangle`] tells the cycles apart).
pub(crate) fn colour(i: usize) -> RGBColor {
    PALETTE[i % PALETTE.len()]
}

/// Series past the palette's first cycle are drawn with triangles instead of circles.
pub(crate) fn marker_triangle(i: usize) -> bool {
    (i / PALETTE.len()) % 2 == 1
}

/// One point of a throughput-vs-cores series.
pub(crate) struct CorePoint {
    pub(crate) cores: u32,
    pub(crate) mpps: f64,
    /// Over the series' one-core point (None without one).
    pub(crate) speedup: Option<f64>,
    /// From logical workers taking turns (`--virtual-cores`), not a real run.
    pub(crate) projected: bool,
    /// Trusted ([`crate::reps::Trust::ok`]); flagged points are hollow.
    pub(crate) ok: bool,
    /// Smallest and largest over `--reps`.
    pub(crate) bar: Option<(f64, f64)>,
}

/// One line of a throughput-vs-cores plot.
pub(crate) struct CoreSeries {
    pub(crate) label: String,
    pub(crate) points: Vec<CorePoint>,
}

/// Writes a throughput-vs-cores PNG: Mpps on the left, speed-up over one core with the ideal (linear) line on the
/// right, integer core ticks, the Okabe-Ito palette, real runs solid and projections dashed, a marker per point
/// (hollow: flagged), min-max bars with `--reps`, and the legend beside the panels (never over the data).
/// Without a font (`text` false) the same without any text.
pub(crate) fn cores_png(path: &std::path::Path, title: &str, series: &[CoreSeries], text: bool) -> Result<(), String> {
    use plotters::element::DashedPathElement;
    use plotters::prelude::*;
    let err = |e: &dyn std::fmt::Display| format!("{}: {e}", path.display());
    // A series measured on one core count only (refused on the others) is no line against cores: named apart in
    // the legend, not drawn as a lone dot listed like the others.
    let (drawn, lone): (Vec<&CoreSeries>, Vec<&CoreSeries>) = series.iter().partition(|s| s.points.len() > 1);
    let series = drawn;
    let pts = || series.iter().flat_map(|s| s.points.iter());
    let xmax = pts().map(|p| p.cores).max().unwrap_or(1).max(2);
    let ymax = pts().map(|p| p.bar.map_or(p.mpps, |b| b.1.max(p.mpps))).fold(0.1f64, f64::max) * 1.1;
    let smax = pts().filter_map(|p| p.speedup).fold(f64::from(xmax), f64::max) * 1.05;
    let root = BitMapBackend::new(path, (1500, 660)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| err(&e))?;
    footer(&root, text).map_err(|e| err(&e))?;
    let root = root.margin(0, 22, 0, 0);
    let root = if text { root.titled(title, ("sans-serif", 22)).map_err(|e| err(&e))? } else { root };
    let (panels, legend) = root.split_horizontally(1140);
    let (left, right) = panels.split_horizontally(570);
    for (area, speedup) in [(&left, false), (&right, true)] {
        let top = if speedup { smax } else { ymax };
        let mut b = ChartBuilder::on(area);
        b.margin(14);
        if text {
            b.caption(if speedup { "speed-up over 1 core" } else { "throughput" }, ("sans-serif", 18))
                .x_label_area_size(40)
                .y_label_area_size(56);
        }
        let mut chart = b.build_cartesian_2d(1u32..xmax, 0.0f64..top).map_err(|e| err(&e))?;
        let ticks = xmax as usize;
        if text {
            chart
                .configure_mesh()
                .x_labels(ticks)
                .x_desc("cores (> real cores: projected)")
                .y_desc(if speedup { "x one core" } else { "Mpps" })
                .draw()
                .map_err(|e| err(&e))?;
        } else {
            chart.configure_mesh().x_labels(ticks).disable_x_mesh().disable_y_mesh().draw().map_err(|e| err(&e))?;
        }
        if speedup {
            let grey = RGBColor(150, 150, 150);
            chart
                .draw_series(DashedLineSeries::new(vec![(1, 1.0), (xmax, f64::from(xmax))], 4, 4, grey.stroke_width(1)))
                .map_err(|e| err(&e))?;
        }
        for (i, s) in series.iter().enumerate() {
            let c = colour(i);
            let y = |p: &CorePoint| if speedup { p.speedup } else { Some(p.mpps) };
            let on: Vec<(&CorePoint, f64)> = s.points.iter().filter_map(|p| y(p).map(|v| (p, v))).collect();
            for w in on.windows(2) {
                let seg = vec![(w[0].0.cores, w[0].1), (w[1].0.cores, w[1].1)];
                if w[1].0.projected {
                    chart.draw_series(DashedLineSeries::new(seg, 8, 5, c.stroke_width(2))).map_err(|e| err(&e))?;
                } else {
                    chart.draw_series(LineSeries::new(seg, c.stroke_width(2))).map_err(|e| err(&e))?;
                }
            }
            if !speedup {
                let bars = on.iter().filter_map(|(p, _)| {
                    p.bar.map(|(lo, hi)| PathElement::new(vec![(p.cores, lo), (p.cores, hi)], c.stroke_width(1)))
                });
                chart.draw_series(bars).map_err(|e| err(&e))?;
            }
            for (p, v) in &on {
                let style = if p.ok { c.filled() } else { WHITE.filled() };
                let edge = c.stroke_width(2);
                if marker_triangle(i) {
                    chart.draw_series([TriangleMarker::new((p.cores, *v), 7, style)]).map_err(|e| err(&e))?;
                    chart.draw_series([TriangleMarker::new((p.cores, *v), 7, edge)]).map_err(|e| err(&e))?;
                } else {
                    chart.draw_series([Circle::new((p.cores, *v), 5, style)]).map_err(|e| err(&e))?;
                    chart.draw_series([Circle::new((p.cores, *v), 5, edge)]).map_err(|e| err(&e))?;
                }
            }
        }
    }
    if text {
        let row = |k: usize| 40 + 22 * k as i32;
        for (i, s) in series.iter().enumerate() {
            let (c, y) = (colour(i), row(i));
            legend.draw(&PathElement::new(vec![(10, y), (44, y)], c.stroke_width(2))).map_err(|e| err(&e))?;
            if marker_triangle(i) {
                legend.draw(&TriangleMarker::new((27, y), 7, c.filled())).map_err(|e| err(&e))?;
            } else {
                legend.draw(&Circle::new((27, y), 5, c.filled())).map_err(|e| err(&e))?;
            }
            legend.draw(&Text::new(s.label.clone(), (52, y - 8), ("sans-serif", 15))).map_err(|e| err(&e))?;
        }
        let k = series.len() + 1;
        let black = BLACK.stroke_width(2);
        legend.draw(&PathElement::new(vec![(10, row(k)), (44, row(k))], black)).map_err(|e| err(&e))?;
        legend.draw(&Text::new("real run", (52, row(k) - 8), ("sans-serif", 15))).map_err(|e| err(&e))?;
        legend
            .draw(&DashedPathElement::new(vec![(10, row(k + 1)), (44, row(k + 1))], 8, 5, black))
            .map_err(|e| err(&e))?;
        legend.draw(&Text::new("projected", (52, row(k + 1) - 8), ("sans-serif", 15))).map_err(|e| err(&e))?;
        let grey = RGBColor(150, 150, 150).stroke_width(1);
        legend
            .draw(&DashedPathElement::new(vec![(10, row(k + 2)), (44, row(k + 2))], 4, 4, grey))
            .map_err(|e| err(&e))?;
        legend.draw(&Text::new("ideal (linear)", (52, row(k + 2) - 8), ("sans-serif", 15))).map_err(|e| err(&e))?;
        legend.draw(&Circle::new((27, row(k + 3)), 5, BLACK.stroke_width(2))).map_err(|e| err(&e))?;
        legend
            .draw(&Text::new("flagged: not to quote", (52, row(k + 3) - 8), ("sans-serif", 15)))
            .map_err(|e| err(&e))?;
        legend.draw(&PathElement::new(vec![(27, row(k + 4) - 7), (27, row(k + 4) + 7)], black)).map_err(|e| err(&e))?;
        legend
            .draw(&Text::new("min-max over --reps", (52, row(k + 4) - 8), ("sans-serif", 15)))
            .map_err(|e| err(&e))?;
        if !lone.is_empty() {
            let grey = ("sans-serif", 14).into_font().color(&RGBColor(90, 90, 90));
            let head = "not drawn: one core count only (see the table)";
            legend.draw(&Text::new(head, (10, row(k + 6) - 8), grey.clone())).map_err(|e| err(&e))?;
            for (j, s) in lone.iter().enumerate() {
                let at = (20, row(k + 7 + j) - 8);
                legend.draw(&Text::new(s.label.clone(), at, grey.clone())).map_err(|e| err(&e))?;
            }
        }
    }
    root.present().map_err(|e| err(&e))?;
    Ok(())
}

/// One point of a `flowplane sweep` plot.
pub struct SweepPoint {
    /// Index of the variable's value.
    pub at: usize,
    /// Median Mpps over the rounds (None: no run gave a figure).
    pub mpps: Option<f64>,
    /// Smallest and largest round.
    pub bar: Option<(f64, f64)>,
    /// No round flagged or failed.
    pub ok: bool,
}

/// One line of a `flowplane sweep` plot: the other variables' values.
pub struct SweepSeries {
    /// The other variables, `k=v ...`.
    pub label: String,
    /// Its points.
    pub points: Vec<SweepPoint>,
}

/// Writes a sweep's PNG for one variable: median Mpps against the variable's values (in the file's order), one
/// line per combination of the other variables (the legend beside the plot, at most 24 listed), min-max bars,
/// flagged points hollow, the Okabe-Ito palette and the provenance footer.
pub fn sweep_png(
    path: &std::path::Path,
    variable: &str,
    values: &[String],
    series: &[SweepSeries],
) -> Result<(), String> {
    use plotters::prelude::*;
    let err = |e: &dyn std::fmt::Display| format!("{}: {e}", path.display());
    let text = register_font();
    let n = values.len().max(2) as u32;
    let ymax = series
        .iter()
        .flat_map(|s| s.points.iter())
        .filter_map(|p| p.bar.map(|b| b.1).or(p.mpps))
        .fold(0.1f64, f64::max)
        * 1.1;
    let root = BitMapBackend::new(path, (1400, 660)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| err(&e))?;
    footer(&root, text).map_err(|e| err(&e))?;
    let root = root.margin(0, 22, 0, 0);
    let (plot, legend) = root.split_horizontally(900);
    let mut b = ChartBuilder::on(&plot);
    b.margin(16);
    if text {
        let flagged = flagged_note(series.iter().flat_map(|s| s.points.iter()).any(|p| !p.ok));
        b.caption(format!("sweep: Mpps vs {variable}{flagged}"), ("sans-serif", 20))
            .x_label_area_size(44)
            .y_label_area_size(60);
    }
    let mut chart = b.build_cartesian_2d(0u32..n - 1, 0.0f64..ymax).map_err(|e| err(&e))?;
    let label = |x: &u32| values.get(*x as usize).cloned().unwrap_or_default();
    if text {
        chart
            .configure_mesh()
            .x_labels(n as usize)
            .x_label_formatter(&label)
            .x_desc(variable)
            .y_desc("Mpps (median of the rounds)")
            .draw()
            .map_err(|e| err(&e))?;
    } else {
        chart.configure_mesh().x_labels(n as usize).disable_x_mesh().disable_y_mesh().draw().map_err(|e| err(&e))?;
    }
    for (i, s) in series.iter().enumerate() {
        let c = colour(i);
        let pts: Vec<(u32, f64)> = s.points.iter().filter_map(|p| p.mpps.map(|m| (p.at as u32, m))).collect();
        chart.draw_series(LineSeries::new(pts, c.stroke_width(2))).map_err(|e| err(&e))?;
        for p in &s.points {
            let Some(m) = p.mpps else { continue };
            let x = p.at as u32;
            if let Some((lo, hi)) = p.bar {
                chart
                    .draw_series([PathElement::new(vec![(x, lo), (x, hi)], c.stroke_width(1))])
                    .map_err(|e| err(&e))?;
            }
            let fill = if p.ok { c.filled() } else { WHITE.filled() };
            chart.draw_series([Circle::new((x, m), 5, fill)]).map_err(|e| err(&e))?;
            chart.draw_series([Circle::new((x, m), 5, c.stroke_width(2))]).map_err(|e| err(&e))?;
        }
    }
    if text {
        for (i, s) in series.iter().take(24).enumerate() {
            let (c, y) = (colour(i), 40 + 22 * i as i32);
            legend.draw(&PathElement::new(vec![(10, y), (44, y)], c.stroke_width(2))).map_err(|e| err(&e))?;
            legend.draw(&Circle::new((27, y), 5, c.filled())).map_err(|e| err(&e))?;
            legend.draw(&Text::new(s.label.clone(), (52, y - 8), ("sans-serif", 14))).map_err(|e| err(&e))?;
        }
        if series.len() > 24 {
            let y = 40 + 22 * 24;
            let more = format!("... {} more (results.json)", series.len() - 24);
            legend.draw(&Text::new(more, (10, y - 8), ("sans-serif", 14))).map_err(|e| err(&e))?;
        }
    }
    root.present().map_err(|e| err(&e))?;
    Ok(())
}

//! What the PNG plots share: the font for their text and the legend box.

use plotters::chart::{ChartContext, SeriesLabelPosition};
use plotters::coord::CoordTranslate;
use plotters::drawing::DrawingAreaErrorKind;
use plotters::prelude::{Cartesian2d, Circle, DrawingBackend, PathElement, Ranged, BLACK, WHITE};
use plotters::style::{Color, FontStyle, RGBAColor};

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

/// Draws the series' legend in a white box with a black border at `pos`.
pub(crate) fn legend<'a, DB: DrawingBackend + 'a, CT: CoordTranslate>(
    chart: &mut ChartContext<'a, DB, CT>,
    pos: SeriesLabelPosition,
) -> Result<(), DrawingAreaErrorKind<DB::ErrorType>> {
    chart.configure_series_labels().background_style(WHITE.mix(0.8)).border_style(BLACK).position(pos).draw()
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

/// Draws `marks` in `color` (see [`Mark`]).
pub(crate) fn marks<'a, DB: DrawingBackend + 'a, X: Ranged<ValueType = f64>, Y: Ranged<ValueType = f64>>(
    chart: &mut ChartContext<'a, DB, Cartesian2d<X, Y>>,
    marks: &[Mark],
    color: RGBAColor,
) -> Result<(), DrawingAreaErrorKind<DB::ErrorType>> {
    chart.draw_series(marks.iter().map(|m| {
        let style = if m.ok { color.filled() } else { WHITE.filled() };
        Circle::new((m.x, m.y), 5, style)
    }))?;
    chart.draw_series(marks.iter().map(|m| Circle::new((m.x, m.y), 5, color.stroke_width(2))))?;
    chart.draw_series(
        marks.iter().filter_map(|m| m.bar.map(|(lo, hi)| PathElement::new(vec![(m.x, lo), (m.x, hi)], color.stroke_width(1)))),
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

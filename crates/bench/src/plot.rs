//! What the PNG plots share: the font for their text and the legend box.

use plotters::chart::{ChartContext, SeriesLabelPosition};
use plotters::coord::CoordTranslate;
use plotters::drawing::DrawingAreaErrorKind;
use plotters::prelude::{DrawingBackend, BLACK, WHITE};
use plotters::style::{Color, FontStyle};

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

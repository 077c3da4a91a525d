//! `--reps N` for every suite: the whole suite runs N times over (rounds,
//! not N runs of a row back to back, so a slow spell of the machine spreads
//! over every row instead of sinking one), and the rows are merged: per row,
//! the figure's [`Spread`] (min/median/max) and the row of the median
//! repetition (its other columns are that repetition's, so they agree with
//! the figure shown).

pub use flowplane_engine::trust::{footnote, Spread, Trust};
use flowplane_trace::progress::{Progress, Unit};

/// Runs `once(round)` `reps` times (at least once) and merges the rounds'
/// rows by position; `fig` is a row's figure (None: refused or not
/// measured — such a row keeps the first round's and has no spread).
pub fn repeat<R>(
    reps: usize,
    mut once: impl FnMut(usize) -> Result<Vec<R>, String>,
    fig: impl Fn(&R) -> Option<f64>,
) -> Result<Vec<(R, Option<Spread>)>, String> {
    let mut cols: Vec<Vec<R>> = Vec::new();
    // On a terminal: the rounds done, the time spent and left (the suites' rows title it as they are measured).
    let bar = Progress::bar("measuring", reps.max(1) as u64, Unit::Rounds);
    for round in 0..reps.max(1) {
        let rows = once(round)?;
        bar.set(round as u64 + 1);
        if round == 0 {
            cols = rows.into_iter().map(|r| vec![r]).collect();
        } else if rows.len() != cols.len() {
            return Err(format!("repetition {} measured {} rows, the first {}", round + 1, rows.len(), cols.len()));
        } else {
            for (c, r) in cols.iter_mut().zip(rows) {
                c.push(r);
            }
        }
    }
    Ok(cols
        .into_iter()
        .map(|mut col| {
            let figs: Option<Vec<f64>> = col.iter().map(&fig).collect();
            if let Some(s) = figs.as_deref().and_then(Spread::of) {
                let k = figs.as_ref().and_then(|v| v.iter().position(|&x| x == s.median)).unwrap_or(0);
                return (col.swap_remove(k), Some(s));
            }
            (col.swap_remove(0), None)
        })
        .collect())
}

/// The rows of [`repeat`], each with its spread stored (none with one repetition) and the noise rule applied to
/// its trust; `at` names the row's two fields.
pub fn settle<R>(merged: Vec<(R, Option<Spread>)>, at: impl Fn(&mut R) -> (&mut Trust, &mut Option<Spread>)) -> Vec<R> {
    merged
        .into_iter()
        .map(|(mut r, s)| {
            let (trust, spread) = at(&mut r);
            if let Some(s) = &s {
                trust.spread(s);
            }
            *spread = s.filter(|s| s.reps > 1);
            r
        })
        .collect()
}

/// `--reps`: between 1 and 100.
pub fn check(reps: usize) -> Result<usize, String> {
    if (1..=100).contains(&reps) {
        Ok(reps)
    } else {
        Err(format!("--reps {reps}: must be between 1 and 100"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_merge_by_position_around_the_median_round() {
        let figs = [[3.0, 10.0], [1.0, 30.0], [2.0, 20.0]];
        let merged = repeat(3, |k| Ok(vec![(k, Some(figs[k][0])), (k, Some(figs[k][1]))]), |r| r.1).unwrap();
        // Row 0: median 2.0 measured in round 2; row 1: median 20.0 in round 2 too.
        assert_eq!(merged[0].0, (2, Some(2.0)));
        assert_eq!(merged[0].1.as_ref().unwrap().min, 1.0);
        assert_eq!(merged[1].1.as_ref().unwrap().max, 30.0);
        // A row refused in a round keeps the first round's, without a spread.
        let m = repeat(2, |k| Ok(vec![if k == 0 { None } else { Some(1.0) }]), |r| *r).unwrap();
        assert_eq!(m[0], (None, None));
        assert!(repeat(2, |k| Ok(vec![1.0; k + 1]), |r| Some(*r)).is_err());
        assert!(check(0).is_err() && check(3).is_ok());
    }
}

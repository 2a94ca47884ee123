//! Prometheus' `RestoreForState`: after a restart, an alert that was pending or firing
//! keeps the `activeAt` its `ALERTS_FOR_STATE` series recorded, when the outage was
//! shorter than the tolerance: shifted by the downtime while it was pending, so its `for`
//! goes on from where it stopped instead of starting over, and never firing sooner than
//! the grace period after the restart. Rules whose `for` is shorter than the grace period
//! are not restored (as in Prometheus).

use crate::alert::AlertState;
use crate::file::RuleKind;
use crate::group::Group;
use strata_model::{Labels, MatchOp, Matcher};
use strata_store::{SelectLimits, SelectRequest, Store};

/// Restores the `for` state of `g`'s alerting rules after their first evaluation at `ts`
/// and lets them write `ALERTS` from now on.
/// `external` are the labels the sink added to what it stored (a regional's external
/// labels), so the `ALERTS_FOR_STATE` series it wrote is found with them.
pub async fn restore_for_state(
    g: &mut Group,
    ts: i64,
    store: &dyn Store,
    external: &Labels,
    tolerance_ms: i64,
    grace_ms: i64,
) {
    for rule in g.rules.iter_mut() {
        let Some(state) = rule.alerts.as_mut() else { continue };
        if rule.spec.kind != RuleKind::Alerting || rule.spec.for_ms < grace_ms {
            state.restored = true;
            continue;
        }
        let hold = rule.spec.for_ms;
        for a in state.active.values_mut() {
            if a.state == AlertState::Inactive {
                continue;
            }
            let mut matchers: Vec<Matcher> =
                a.labels.iter().filter_map(|l| Matcher::new(MatchOp::Equal, &l.name, &l.value).ok()).collect();
            matchers.extend(Matcher::new(MatchOp::Equal, "__name__", "ALERTS_FOR_STATE").ok());
            let from = ts.saturating_sub(tolerance_ms);
            let mut req = SelectRequest::new(matchers, from, ts);
            req.limits = SelectLimits { max_series: 64, max_samples: 10_000_000 };
            let found = match store.select(&req).await {
                Ok(f) => f,
                Err(e) => {
                    tracing::warn!(rule = %rule.spec.name, labels = %a.labels, error = %e, "restoring alert state failed");
                    continue;
                }
            };
            // The series whose labels are exactly the alert's (and its name), with the
            // external labels it was stored with: equality matchers also match series with
            // more labels.
            let expected = crate::with_external(&a.labels, external);
            let Some(s) = found.into_iter().find(|s| {
                let mut b = s.labels.to_builder();
                b.del("__name__");
                b.build() == expected
            }) else {
                continue;
            };
            let Ok(samples) = s.samples(from, ts) else { continue };
            // The newest sample before now: a staleness marker there means the alert had
            // resolved, and a new occurrence starts its `for` afresh.
            let Some(last) = samples.iter().rev().find(|x| x.t < ts) else { continue };
            if strata_model::is_stale(last.v) {
                continue;
            }
            if !last.v.is_finite() || last.v < 0.0 || last.v > 1e11 {
                continue;
            }
            let down_at = last.t.div_euclid(1000) * 1000;
            if ts - down_at >= tolerance_ms {
                continue;
            }
            let mut active_at = (last.v as i64).saturating_mul(1000);
            let remaining = hold - (down_at - active_at);
            if remaining <= 0 {
                // It was firing: it still is, since its old time.
            } else if remaining < grace_ms {
                active_at = ts + grace_ms - hold;
            } else {
                active_at += ts - down_at;
            }
            a.active_at = active_at;
            tracing::info!(rule = %rule.spec.name, labels = %a.labels, active_at, "alert `for` state restored");
        }
        state.restored = true;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::file::parse_groups;
    use crate::group::{EvalContext, RuleSink};
    use async_trait::async_trait;
    use strata_model::{Labels, MetricType, Sample};
    use strata_promql::{Engine, EngineOptions};
    use strata_store::memory::MemoryStore;

    struct Nowhere;

    #[async_trait]
    impl RuleSink for Nowhere {
        async fn append(&self, _: Vec<(Labels, Sample)>) -> Result<usize, String> {
            Ok(0)
        }
    }

    const MIN: i64 = 60_000;

    /// A rule with `for: 20m` true since 0; the process went down at 12m after writing
    /// `ALERTS_FOR_STATE` every minute, and comes back at `restart`.
    async fn restored_active_at(down_at: i64, restart: i64, grace: i64) -> (i64, AlertState) {
        restored_with(down_at, restart, grace, &[], false).await
    }

    /// As [`restored_active_at`], the state series stored with `external` labels added,
    /// and a staleness marker after its last sample when `resolved`.
    async fn restored_with(
        down_at: i64,
        restart: i64,
        grace: i64,
        external: &[(&str, &str)],
        resolved: bool,
    ) -> (i64, AlertState) {
        let spec =
            parse_groups("r.yml", "groups:\n- name: g\n  rules:\n  - alert: Hot\n    expr: temp > 80\n    for: 20m\n")
                .unwrap()
                .remove(0);
        let mut store = MemoryStore::default();
        let temp = Labels::from_pairs([("__name__", "temp"), ("gpu", "0")]);
        store.add(temp, MetricType::Gauge, (0..=restart / MIN).map(|i| Sample::new(i * MIN, 90.0)));
        let mut pairs = vec![("__name__", "ALERTS_FOR_STATE"), ("alertname", "Hot"), ("gpu", "0")];
        pairs.extend_from_slice(external);
        let mut samples: Vec<Sample> = (0..=down_at / MIN).map(|i| Sample::new(i * MIN, 0.0)).collect();
        if resolved {
            samples.push(Sample::new(down_at + MIN / 2, strata_model::stale_nan()));
        }
        store.add(Labels::from_pairs(pairs), MetricType::Gauge, samples);
        let external = Labels::from_pairs(external.iter().copied());
        let mut g = Group::new(spec, MIN);
        g.set_restored(false);
        let engine = Engine::new(EngineOptions::default());
        let ctx = EvalContext { store: &store, engine: &engine, external_labels: &Labels::default(), external_url: "" };
        g.eval(restart, &ctx, &Nowhere).await;
        restore_for_state(&mut g, restart, &store, &external, 60 * MIN, grace).await;
        let a = g.rules[0].alerts.as_ref().unwrap();
        assert!(a.restored);
        let alert = a.active_alerts()[0].clone();
        // The next evaluation decides firing from the restored time.
        let mut g2 = g;
        g2.eval(restart + MIN, &ctx, &Nowhere).await;
        let state = g2.rules[0].alerts.as_ref().unwrap().active_alerts()[0].state;
        (alert.active_at, state)
    }

    #[tokio::test]
    async fn a_pending_alert_goes_on_from_where_it_stopped() {
        // Pending 12 of 20 minutes when it went down, back 5 minutes later: 8 minutes to go.
        let (active_at, state) = restored_active_at(12 * MIN, 17 * MIN, 2 * MIN).await;
        assert_eq!(active_at, 5 * MIN, "shifted by the 5 minutes down");
        assert_eq!(state, AlertState::Pending);
        // Firing 20 minutes after its restored start, not 20 minutes after the restart.
        let (active_at, _) = restored_active_at(12 * MIN, 17 * MIN, 2 * MIN).await;
        assert_eq!(active_at + 20 * MIN, 25 * MIN);
    }

    #[tokio::test]
    async fn a_firing_alert_stays_firing_and_the_grace_period_holds() {
        // Down after 25 minutes: it was firing, and fires at once with its old start.
        let (active_at, state) = restored_active_at(25 * MIN, 27 * MIN, 2 * MIN).await;
        assert_eq!((active_at, state), (0, AlertState::Firing));
        // One minute of `for` left when it went down: it waits out the grace period.
        let (active_at, state) = restored_active_at(19 * MIN, 21 * MIN, 5 * MIN).await;
        assert_eq!(active_at, 21 * MIN + 5 * MIN - 20 * MIN);
        assert_eq!(state, AlertState::Pending);
    }

    #[tokio::test]
    async fn an_outage_longer_than_the_tolerance_starts_over() {
        let (active_at, _) = restored_active_at(12 * MIN, 80 * MIN, 2 * MIN).await;
        assert_eq!(active_at, 80 * MIN);
    }

    #[tokio::test]
    async fn the_state_is_found_with_the_external_labels_it_was_stored_with() {
        let (active_at, state) = restored_with(12 * MIN, 17 * MIN, 2 * MIN, &[("region", "eu")], false).await;
        assert_eq!((active_at, state), (5 * MIN, AlertState::Pending));
    }

    #[tokio::test]
    async fn an_alert_that_had_resolved_is_not_restored() {
        // Firing before it resolved: the new occurrence waits its whole `for` again.
        let (active_at, state) = restored_with(25 * MIN, 27 * MIN, 2 * MIN, &[], true).await;
        assert_eq!((active_at, state), (27 * MIN, AlertState::Pending));
    }
}

//! The kill switch's rows (SPEC §5.8): written with their operator event, read back after
//! a restart, and kept by retention, which prunes the events themselves.

use super::*;

#[test]
fn a_suspension_is_chained_with_its_row_and_survives_a_restart_and_retention() {
    let dir = temp_dir();
    let (suspended_b, resumed_a) = {
        let journal = open_pruning(dir.path());
        let rt = rt();
        let a = rt.block_on(journal.switch_agent("a", true, Some("runaway".into())));
        let b = rt.block_on(journal.switch_agent("b", true, None));
        let resumed = rt.block_on(journal.switch_agent("a", false, None));
        let (Ok(a), Ok(b), Ok(resumed)) = (a, b, resumed) else {
            panic!("switches not journaled");
        };
        assert!(a.0.starts_with("sus_") && resumed.0.starts_with("rsm_"));
        assert_eq!((a.1, b.1, resumed.1), (1, 2, 3));
        (b, resumed)
    };
    let journal = open_pruning(dir.path());
    let rows = journal.suspensions().unwrap_or_default();
    assert_eq!(rows.len(), 1, "{rows:?}");
    assert_eq!(
        (rows[0].agent.as_str(), rows[0].id.as_str(), rows[0].seq),
        ("b", suspended_b.0.as_str(), 2)
    );
    let events = journal.events(&resumed_a.0).unwrap_or_default();
    assert_eq!(events.len(), 1);
    assert_eq!(events[0].kind, EventKind::AgentResumed);
    assert_eq!(events[0].source, Source::OperatorAttested);
    assert_eq!(events[0].data["agent"], "a");
    assert!(journal.verify().is_ok_and(|r| r.ok && r.events == 3));
    // Retention takes the events; the row that stands for b's suspension stays.
    std::thread::sleep(std::time::Duration::from_millis(20));
    let pruned = rt().block_on(journal.prune_events());
    assert!(pruned.as_ref().is_ok_and(|n| *n >= 3), "{pruned:?}");
    let rows = journal.suspensions().unwrap_or_default();
    assert_eq!(rows.len(), 1, "{rows:?}");
    assert_eq!(rows[0].agent, "b");
}

//! What every backend of the services must do, checked the same way for each: the SQLite
//! store runs these in `store/services.rs`, [`InMemory`](super::InMemory) in its own
//! module. A new backend passes them before anything uses it.

use super::{
    Answer, ApprovalState, AuditRecord, Claim, CostsBy, CostsOf, ForwardId, Forwarded, Lease,
    NewApproval, NewMemory, NewTask, Priority, REDACTED, Receipt, ServiceError, Services,
    TaskFilter, TaskPatch, TaskStatus, Verdict, WorkerState, WorkingEntry, day_of, sum_costs,
};
use crate::flow::{ArgsDigest, Label, Origin};
use crate::ids::ProcessKind;
use crate::ids::testing::{by, key, pid};

/// Runs every check, each on fresh services from `fresh`.
pub(crate) async fn check_all(fresh: impl AsyncFn() -> Services) {
    tasks_are_numbered_listed_and_filtered(&fresh().await).await;
    status_changes_follow_the_allowed_transitions(&fresh().await).await;
    bad_tasks_are_refused_with_a_reason(&fresh().await).await;
    recall_finds_by_words_ranks_by_importance_and_forgets_deleted(&fresh().await).await;
    working_memory_expires_and_lists_by_prefix(&fresh().await).await;
    history_appends_in_order_replaces_and_refuses_to_load_short(&fresh().await).await;
    audit_redacts_and_lists_newest_first(&fresh().await).await;
    receipts_are_kept_and_summed_alike(&fresh().await).await;
    the_ledger_numbers_processes_and_interrupts_the_workers_of_ended_runs(&fresh().await).await;
    recall_matches_whole_words_of_kind_and_content_whatever_their_case(&fresh().await).await;
    a_long_ttl_is_a_long_life(&fresh().await).await;
    a_worker_is_recorded_once_and_its_end_is_final(&fresh().await).await;
    conversations_workers_and_audit_pages_list_what_is_stored(&fresh().await).await;
    a_run_owns_the_sessions_it_claims_and_forwarded_messages_are_taken_once(&fresh().await).await;
    an_approval_covers_one_process_tool_and_digest_for_its_uses(&fresh().await).await;
    a_parked_call_is_decided_once_and_shown_as_it_would_run(&fresh().await).await;
    every_decision_is_a_row_of_one_signed_chain(&fresh().await).await;
    an_endorsement_vouches_for_the_values_its_call_carried(&fresh().await).await;
    a_file_s_label_holds_for_the_version_written_and_listings_join_what_lies_beneath(
        &fresh().await,
    )
    .await;
    tasks_and_memories_keep_what_went_into_them(&fresh().await).await;
}

async fn tasks_and_memories_keep_what_went_into_them(s: &Services) {
    use crate::flow::Scope;

    let page = Label::untrusted(Origin::Net("example.com".into()));
    let notes = Label::private(Scope::Workspace);
    let task = NewTask {
        label: page.clone(),
        ..NewTask::titled("Pay the invoice")
    };
    let created = s.tasks.create(&by("worker:1"), task).await.unwrap();
    assert_eq!(created.label, page);
    assert_eq!(s.tasks.get(created.number).await.unwrap().label, page);
    // An update joins its writer's label: what was in the task stays.
    let patch = TaskPatch {
        description: Some("from the notes".into()),
        label: notes.clone(),
        ..TaskPatch::default()
    };
    let updated = s.tasks.update(created.number, patch).await.unwrap();
    let both = page.clone().joined(&notes);
    assert_eq!(updated.label, both);
    let listed = s.tasks.list(TaskFilter::default()).await.unwrap();
    assert_eq!(listed[0].label, both);
    // A person's task is trusted.
    let mine = s
        .tasks
        .create(&by("cli"), NewTask::titled("Mine"))
        .await
        .unwrap();
    assert!(mine.label.is_clear());

    let memory = NewMemory {
        label: page.clone(),
        ..note("fact", "the invoice is due friday", 0.5)
    };
    assert_eq!(
        s.memory.save(&by("worker:1"), memory).await.unwrap().label,
        page
    );
    let found = s.memory.recall("invoice", 5).await.unwrap();
    assert_eq!(found[0].label, page);
}

async fn a_file_s_label_holds_for_the_version_written_and_listings_join_what_lies_beneath(
    s: &Services,
) {
    use crate::flow::Scope;

    use super::{FileLabel, FileStamp};

    let stamp = |ino, len, ctime_ns| FileStamp {
        dev: u64::MAX,
        ino,
        len,
        ctime_ns,
    };
    let page = Label::untrusted(Origin::Net("example.com".into()));
    let notes = Label::private(Scope::Workspace);
    let row = |path: &str, stamp, label: &Label| FileLabel {
        path: path.into(),
        stamp,
        label: label.clone(),
    };
    let (a, b, c) = (stamp(1, 10, 5), stamp(2, 3, -1), stamp(3, 0, 0));
    s.files
        .record(
            "/w",
            vec![
                row("docs/a.md", a, &page),
                row("b.md", b, &notes),
                row("docsx/c.md", c, &notes),
            ],
        )
        .await
        .unwrap();
    let mut found = s.files.get("/w", vec![a, b]).await.unwrap();
    found.sort_by(|x, y| x.path.cmp(&y.path));
    assert_eq!(found, [row("b.md", b, &notes), row("docs/a.md", a, &page)]);
    // Another version of the same file: its row, with the stamp the write left; the same
    // file in another workspace: nothing.
    let changed = stamp(1, 10, 6);
    let found = s.files.get("/w", vec![changed]).await.unwrap();
    assert_eq!(found, [row("docs/a.md", a, &page)]);
    assert!(s.files.get("/other", vec![a]).await.unwrap().is_empty());
    // A write of the same file replaces its row, even under another name.
    let trusted = Label::trusted();
    s.files
        .record("/w", vec![row("docs/renamed.md", changed, &trusted)])
        .await
        .unwrap();
    let found = s.files.get("/w", vec![a]).await.unwrap();
    assert_eq!(found, [row("docs/renamed.md", changed, &trusted)]);
    let found = s.files.get("/w", vec![changed]).await.unwrap();
    assert_eq!(found, [row("docs/renamed.md", changed, &trusted)]);
    // A listing joins what lies beneath it, by path: `docs` holds neither `docsx` nor `b.md`.
    s.files
        .record("/w", vec![row("docs/deep/d.md", stamp(4, 1, 1), &page)])
        .await
        .unwrap();
    assert_eq!(s.files.beneath("/w", "docs").await.unwrap(), page);
    assert_eq!(s.files.beneath("/w", "docs/").await.unwrap(), page);
    assert_eq!(s.files.beneath("/w", "docsx").await.unwrap(), notes);
    assert_eq!(s.files.beneath("/w", "none").await.unwrap(), trusted);
    let all = page.joined(&notes);
    assert_eq!(s.files.beneath("/w", ".").await.unwrap(), all);
    assert_eq!(s.files.beneath("/w", "").await.unwrap(), all);
}

async fn an_endorsement_vouches_for_the_values_its_call_carried(s: &Services) {
    use crate::flow::{Carried, HandleId};

    let (worker, other) = (pid("worker:1"), pid("worker:2"));
    let page = Carried {
        handle: HandleId::FIRST,
        digest: ArgsDigest::of_text("a page"),
    };
    let mail = Carried {
        handle: HandleId::FIRST.next(),
        digest: ArgsDigest::of_text("a mail"),
    };
    let mut call = NewApproval::of(
        &worker,
        "post",
        r#"{"body":"a page","cc":"a mail"}"#,
        "r",
        "l",
    );
    call.handles = vec![page, mail];
    let parked = s.approvals.park(call).await.unwrap();
    assert_eq!(
        parked.handles,
        [page, mail],
        "the handles are kept with the request"
    );
    assert!(!parked.endorsed);
    assert!(s.approvals.endorsed(&worker).await.unwrap().is_empty());
    let decided = s
        .approvals
        .decide(parked.id, Verdict::Endorse(Lease::once()), "ann")
        .await
        .unwrap();
    assert!(decided.endorsed);
    assert_eq!(decided.state, ApprovalState::Approved);
    let endorsed = s.approvals.endorsed(&worker).await.unwrap();
    let values: Vec<Carried> = endorsed.iter().map(|e| e.value).collect();
    assert_eq!(values, [page, mail]);
    assert!(endorsed.iter().all(|e| e.approval == parked.id));
    assert!(s.approvals.endorsed(&other).await.unwrap().is_empty());
    // Read back as stored.
    assert_eq!(s.approvals.get(parked.id).await.unwrap(), decided);
}

async fn every_decision_is_a_row_of_one_signed_chain(s: &Services) {
    use super::{ChainEvent, ChainRecord, Verifier};
    let worker = pid("worker:1");
    let call = NewApproval::of(
        &worker,
        "send",
        r#"{"a":1}"#,
        "untrusted_send",
        "untrusted(mcp:x)",
    );
    let parked = s.approvals.park(call).await.unwrap();
    let lease = Lease {
        ttl_seconds: 600,
        uses: 1,
    };
    s.approvals
        .decide(parked.id, Verdict::Approve(lease), "person")
        .await
        .unwrap();
    s.approvals
        .take(&worker, "send", parked.digest)
        .await
        .unwrap()
        .unwrap();
    let call = NewApproval::of(
        &worker,
        "send",
        r#"{"a":2}"#,
        "untrusted_send",
        "untrusted(mcp:x)",
    );
    let second = s.approvals.park(call).await.unwrap();
    s.approvals.withdraw(second.id).await.unwrap();
    // Appends at once, from many tasks: one line, no place taken twice.
    let appends = (0..12).map(|n| {
        s.chain.record(ChainRecord {
            event: ChainEvent::Refused,
            process: format!("worker:{n}"),
            tool: "send".into(),
            digest: String::new(),
            approval: None,
            by: "host".into(),
            detail: "untrusted_send".into(),
        })
    });
    for appended in futures_util::future::join_all(appends).await {
        appended.unwrap();
    }
    let rows = s.chain.entries(0, 100).await.unwrap();
    assert_eq!(rows.len(), 15);
    let events: Vec<ChainEvent> = rows.iter().take(3).map(|r| r.event).collect();
    assert_eq!(
        events,
        [
            ChainEvent::Approved,
            ChainEvent::Used,
            ChainEvent::Withdrawn
        ]
    );
    assert_eq!(rows[0].by, "person");
    assert_eq!(rows[0].approval, Some(parked.id.get()));
    assert_eq!(rows[0].digest, parked.digest.to_string());
    let mut verifier = Verifier::new(vec![s.chain.public_key()]);
    verifier.check(&rows).unwrap();
    assert_eq!((verifier.rows(), verifier.keys().len()), (15, 1));
    // Paged reads meet where they should.
    let tail = s.chain.entries(10, 100).await.unwrap();
    assert_eq!(tail.first().map(|r| r.seq), Some(11));
}

async fn an_approval_covers_one_process_tool_and_digest_for_its_uses(s: &Services) {
    let (worker, other) = (pid("worker:1"), pid("worker:2"));
    let args = r#"{"amount":10,"to":"me"}"#;
    let call = NewApproval::of(
        &worker,
        "send_money",
        args,
        "untrusted_send",
        "untrusted(mcp:bank)",
    );
    let parked = s.approvals.park(call.clone()).await.unwrap();
    assert_eq!(parked.state, ApprovalState::Pending);
    assert_eq!(parked.arguments, r#"{"amount":10,"to":"me"}"#);
    assert_eq!(parked.digest, ArgsDigest::of(args));
    // The same call parked again is the same request, not a second one.
    assert_eq!(s.approvals.park(call).await.unwrap().id, parked.id);
    assert_eq!(s.approvals.list(true, 10).await.unwrap().len(), 1);
    // Nothing covers a call before a person decides.
    let digest = ArgsDigest::of(args);
    assert!(
        s.approvals
            .take(&worker, "send_money", digest)
            .await
            .unwrap()
            .is_none()
    );

    let lease = Lease {
        ttl_seconds: 600,
        uses: 2,
    };
    let approved = s
        .approvals
        .decide(parked.id, Verdict::Approve(lease), "operator")
        .await
        .unwrap();
    assert_eq!(approved.state, ApprovalState::Approved);
    assert_eq!(approved.decided_by.as_deref(), Some("operator"));
    assert_eq!(approved.uses_left, 2);
    assert!(approved.expires_at.unwrap() >= approved.decided_at.unwrap() + 600);
    assert!(s.approvals.list(true, 10).await.unwrap().is_empty());

    // Other arguments (however close), another tool, another process: not covered.
    let changed = ArgsDigest::of(r#"{"amount":11,"to":"me"}"#);
    for (process, tool, digest) in [
        (&worker, "send_money", changed),
        (&worker, "send_mail", digest),
        (&other, "send_money", digest),
    ] {
        let taken = s.approvals.take(process, tool, digest).await.unwrap();
        assert!(taken.is_none(), "{process} {tool} {digest}: {taken:?}");
    }
    // The same value written otherwise is covered, once per use.
    let reordered = ArgsDigest::of(r#"{ "to": "me", "amount": 10 }"#);
    let first = s
        .approvals
        .take(&worker, "send_money", reordered)
        .await
        .unwrap()
        .unwrap();
    assert_eq!((first.id, first.uses_left), (parked.id, 1));
    assert!(
        s.approvals
            .take(&worker, "send_money", digest)
            .await
            .unwrap()
            .is_some()
    );
    assert!(
        s.approvals
            .take(&worker, "send_money", digest)
            .await
            .unwrap()
            .is_none()
    );
    assert_eq!(s.approvals.get(parked.id).await.unwrap().uses_left, 0);
}

async fn a_parked_call_is_decided_once_and_shown_as_it_would_run(s: &Services) {
    let worker = pid("worker:3");
    // What a guessing redactor would hide is shown: a person approves what they can read.
    let args = r#"{"url":"https://example.com","x_token":"Bearer the-users-private-notes"}"#;
    let call = NewApproval::of(&worker, "web_post", args, "leak", "secret(KEY)");
    let parked = s.approvals.park(call).await.unwrap();
    assert!(
        parked.arguments.contains("Bearer the-users-private-notes"),
        "{}",
        parked.arguments
    );
    assert_eq!(parked.digest, ArgsDigest::of(args));

    let denied = s
        .approvals
        .decide(parked.id, Verdict::Deny, "operator")
        .await
        .unwrap();
    assert_eq!(denied.state, ApprovalState::Denied);
    let again = s
        .approvals
        .decide(parked.id, Verdict::Approve(Lease::once()), "operator")
        .await;
    let err = again.unwrap_err().to_string();
    assert!(
        err.contains("is denied") && err.contains("only a pending"),
        "{err}"
    );
    assert!(!s.approvals.withdraw(parked.id).await.unwrap());
    assert!(
        s.approvals
            .take(&worker, "web_post", parked.digest)
            .await
            .unwrap()
            .is_none()
    );

    // A lease out of range, or no one named, is refused before it is stored.
    let next = NewApproval::of(&worker, "web_post", "{}", "leak", "secret(KEY)");
    let next = s.approvals.park(next).await.unwrap();
    assert_ne!(next.id, parked.id);
    let zero = Lease {
        ttl_seconds: 600,
        uses: 0,
    };
    assert!(
        s.approvals
            .decide(next.id, Verdict::Approve(zero), "op")
            .await
            .is_err()
    );
    assert!(
        s.approvals
            .decide(next.id, Verdict::Deny, " ")
            .await
            .is_err()
    );
    assert!(s.approvals.withdraw(next.id).await.unwrap());
    let withdrawn = s.approvals.get(next.id).await.unwrap();
    assert_eq!(withdrawn.state, ApprovalState::Withdrawn);
    let missing = crate::services::ApprovalId::new(999);
    assert!(matches!(
        s.approvals.get(missing).await,
        Err(ServiceError::NotFound(_))
    ));
    assert!(matches!(
        s.approvals.decide(missing, Verdict::Deny, "op").await,
        Err(ServiceError::NotFound(_))
    ));
    assert_eq!(s.approvals.list(false, 10).await.unwrap()[0].id, next.id);
}

fn status(to: TaskStatus) -> TaskPatch {
    TaskPatch {
        status: Some(to),
        ..TaskPatch::default()
    }
}

async fn tasks_are_numbered_listed_and_filtered(s: &Services) {
    let a = s
        .tasks
        .create(&by("worker:1"), NewTask::titled(" a "))
        .await
        .unwrap();
    let b = NewTask {
        title: "b".into(),
        parent: Some(a.number),
        priority: Some(Priority::High),
        metadata: Some(r#"{"source":"notes.md"}"#.into()),
        ..NewTask::default()
    };
    let b = s.tasks.create(&by("branch:2"), b).await.unwrap();
    assert_eq!(
        (a.number, a.title.as_str()),
        (1, "a"),
        "numbered, title trimmed"
    );
    assert_eq!(b.number, 2);
    assert_eq!(
        (b.status, b.priority, b.creator.to_string().as_str()),
        (TaskStatus::Backlog, Priority::High, "branch:2")
    );
    assert_eq!((a.priority, a.metadata.as_str()), (Priority::Normal, "{}"));
    let subtasks = TaskFilter {
        parent: Some(1),
        ..TaskFilter::default()
    };
    assert_eq!(s.tasks.list(subtasks).await.unwrap(), vec![b.clone()]);
    assert_eq!(s.tasks.list(TaskFilter::default()).await.unwrap().len(), 2);
    s.tasks.update(1, status(TaskStatus::Ready)).await.unwrap();
    let ready = TaskFilter {
        status: Some(TaskStatus::Ready),
        ..TaskFilter::default()
    };
    let listed = s.tasks.list(ready).await.unwrap();
    assert_eq!(listed.iter().map(|t| t.number).collect::<Vec<_>>(), [1]);
    let one = TaskFilter {
        limit: Some(1),
        ..TaskFilter::default()
    };
    assert_eq!(s.tasks.list(one).await.unwrap().len(), 1);
    let assign = TaskPatch {
        assigned_worker: Some(pid("worker:7")),
        ..TaskPatch::default()
    };
    let assigned = s.tasks.update(2, assign).await.unwrap();
    assert_eq!(assigned.assigned_worker, Some(pid("worker:7")));
    assert_eq!(assigned.title, "b", "fields not in the patch stay");
    assert_eq!(s.tasks.get(2).await.unwrap(), assigned);
}

async fn status_changes_follow_the_allowed_transitions(s: &Services) {
    let t = s
        .tasks
        .create(&by("w"), NewTask::titled("t"))
        .await
        .unwrap();
    let err = s.tasks.update(t.number, status(TaskStatus::Done)).await;
    let err = err.unwrap_err().to_string();
    assert!(
        err.contains("cannot move from backlog to done")
            && err.contains("it can move to ready, in-progress, cancelled"),
        "{err}"
    );
    let unchanged = s.tasks.get(t.number).await.unwrap();
    assert_eq!(
        unchanged.status,
        TaskStatus::Backlog,
        "a refused move changes nothing"
    );
    s.tasks
        .update(t.number, status(TaskStatus::InProgress))
        .await
        .unwrap();
    let done = s.tasks.update(t.number, status(TaskStatus::Done)).await;
    assert_eq!(done.unwrap().status, TaskStatus::Done);
    let cancel = s
        .tasks
        .update(t.number, status(TaskStatus::Cancelled))
        .await;
    assert!(
        matches!(cancel, Err(ServiceError::Invalid(_))),
        "{cancel:?}"
    );
    let same = s.tasks.update(t.number, status(TaskStatus::Done)).await;
    assert!(same.is_ok(), "staying put is allowed: {same:?}");
}

async fn bad_tasks_are_refused_with_a_reason(s: &Services) {
    let blank = s.tasks.create(&by("w"), NewTask::titled(" ")).await;
    assert!(matches!(blank, Err(ServiceError::Invalid(_))), "{blank:?}");
    let bad_meta = NewTask {
        metadata: Some("[1]".into()),
        ..NewTask::titled("t")
    };
    let err = s
        .tasks
        .create(&by("w"), bad_meta)
        .await
        .unwrap_err()
        .to_string();
    assert!(err.contains("JSON object"), "{err}");
    let orphan = NewTask {
        parent: Some(99),
        ..NewTask::titled("t")
    };
    let err = s.tasks.create(&by("w"), orphan).await.unwrap_err();
    assert!(
        matches!(&err, ServiceError::NotFound(m) if m.contains("#99")),
        "{err}"
    );
    assert!(matches!(
        s.tasks.get(7).await,
        Err(ServiceError::NotFound(_))
    ));
    let missing = s.tasks.update(7, status(TaskStatus::Ready)).await;
    assert!(matches!(missing, Err(ServiceError::NotFound(_))));
    let t = s
        .tasks
        .create(&by("w"), NewTask::titled("t"))
        .await
        .unwrap();
    let blank_title = TaskPatch {
        title: Some("  ".into()),
        ..TaskPatch::default()
    };
    let refused = s.tasks.update(t.number, blank_title).await;
    assert!(matches!(refused, Err(ServiceError::Invalid(_))));
    assert_eq!(s.tasks.list(TaskFilter::default()).await.unwrap().len(), 1);
}

fn note(kind: &str, content: &str, importance: f32) -> NewMemory {
    NewMemory {
        kind: kind.into(),
        content: content.into(),
        importance: Some(importance),
        label: crate::flow::Label::trusted(),
    }
}

async fn recall_finds_by_words_ranks_by_importance_and_forgets_deleted(s: &Services) {
    let m = &s.memory;
    m.save(
        &by("branch:1"),
        note("fact", "The release ships on Friday", 0.2),
    )
    .await
    .unwrap();
    let key = m
        .save(
            &by("branch:1"),
            note("decision", "Release notes go in CHANGES.md", 0.9),
        )
        .await
        .unwrap();
    m.save(&by("branch:1"), note("", "Lunch is at noon", 0.5))
        .await
        .unwrap();
    assert_eq!(
        (key.kind.as_str(), key.source.to_string().as_str()),
        ("decision", "branch:1")
    );
    let found = m.recall("when is the release?", 10).await.unwrap();
    assert_eq!(found.len(), 2, "{found:?}");
    assert_eq!(found[0].id, key.id, "the important one first: {found:?}");
    let lunch = m.recall("lunch", 10).await.unwrap();
    assert_eq!(lunch[0].kind, "fact", "a blank kind is a fact");
    let injection = m.recall("\"; DROP TABLE memories; --", 5).await.unwrap();
    assert!(injection.is_empty(), "{injection:?}");
    assert!(m.recall("   ", 5).await.unwrap().is_empty());
    assert_eq!(
        m.recall("release", 1).await.unwrap().len(),
        1,
        "the limit holds"
    );
    m.delete(key.id).await.unwrap();
    assert_eq!(m.recall("release", 10).await.unwrap().len(), 1);
    assert!(matches!(
        m.delete(key.id).await,
        Err(ServiceError::NotFound(_))
    ));
    let empty = m.save(&by("b"), note("fact", " ", 0.5)).await;
    assert!(matches!(empty, Err(ServiceError::Invalid(_))));
    let heavy = m.save(&by("b"), note("fact", "x", 1.5)).await.unwrap_err();
    assert!(heavy.to_string().contains("between 0.0 and 1.0"), "{heavy}");
}

async fn working_memory_expires_and_lists_by_prefix(s: &Services) {
    let m = &s.memory;
    let (trusted, page) = (
        Label::trusted(),
        Label::untrusted(Origin::Net("x.test".into())),
    );
    let value = |entry: Option<WorkingEntry>| entry.map(|e| e.value);
    m.working_set("notifications/result/w1", "done", &trusted, None)
        .await
        .unwrap();
    m.working_set("notifications/status/w2", "waiting", &page, Some(3600))
        .await
        .unwrap();
    m.working_set("notifications/error/w3", "gone", &trusted, Some(0))
        .await
        .unwrap();
    m.working_set("scratch", "x", &page, None).await.unwrap();
    let got = m.working_get("notifications/result/w1").await.unwrap();
    assert_eq!(value(got).as_deref(), Some("done"));
    let expired = m.working_get("notifications/error/w3").await.unwrap();
    assert_eq!(expired, None, "expired");
    assert_eq!(
        m.working_keys("notifications/").await.unwrap(),
        ["notifications/result/w1", "notifications/status/w2"]
    );
    // Each entry keeps what its writer had read; a rewrite takes the new writer's.
    let got = m.working_get("notifications/status/w2").await.unwrap();
    assert_eq!(got.map(|e| e.label), Some(page.clone()));
    let got = m.working_get("scratch").await.unwrap().unwrap();
    assert_eq!((got.value.as_str(), got.label), ("x", page));
    m.working_set("scratch", "y", &trusted, None).await.unwrap();
    let got = m.working_get("scratch").await.unwrap().unwrap();
    assert_eq!((got.value.as_str(), got.label), ("y", trusted.clone()));
    assert_eq!(m.working_get("nothing").await.unwrap(), None);
    let empty = m.working_set("", "v", &trusted, None).await;
    assert!(matches!(empty, Err(ServiceError::Invalid(_))));
}

async fn history_appends_in_order_replaces_and_refuses_to_load_short(s: &Services) {
    let h = &s.history;
    h.append(&key("c"), vec!["1".into(), "2".into()])
        .await
        .unwrap();
    h.append(&key("c"), vec!["3".into()]).await.unwrap();
    h.append(&key("other"), vec![r#""x""#.into()])
        .await
        .unwrap();
    let numbers: Vec<u32> = h.load_as(&key("c")).await.unwrap();
    assert_eq!(numbers, [1, 2, 3]);
    h.replace(&key("c"), vec![r#""summary""#.into(), "3".into()])
        .await
        .unwrap();
    let entries = h.load(&key("c")).await.unwrap();
    assert_eq!(
        (entries[0].seq, entries[0].message.as_str(), entries.len()),
        (0, r#""summary""#, 2)
    );
    assert_eq!(h.load(&key("other")).await.unwrap().len(), 1);
    assert!(h.load(&key("never")).await.unwrap().is_empty());
    let err = h.load_as::<u32>(&key("c")).await.unwrap_err();
    assert!(
        matches!(&err, ServiceError::UnreadableHistory { channel, seq: 0, .. } if channel == "channel:c"),
        "{err}"
    );
    assert!(err.to_string().contains(&h.location()), "{err}");
    h.append(&key("broken"), vec!["1".into(), "{".into()])
        .await
        .unwrap();
    let err = h.load(&key("broken")).await.unwrap_err();
    assert!(
        matches!(&err, ServiceError::UnreadableHistory { seq: 1, .. }),
        "not returned short: {err}"
    );
}

async fn audit_redacts_and_lists_newest_first(s: &Services) {
    for (tool, outcome) in [("file_read", "ok"), ("file_write", "denied")] {
        let call = AuditRecord {
            process: "branch:1".into(),
            tool: tool.into(),
            grants: "fs.read".into(),
            arguments: r#"{"path":"x","password":"hunter2"}"#.into(),
            outcome: outcome.into(),
            detail: String::new(),
            duration_us: 42,
            conversation: None,
            receipt: Receipt::default(),
        };
        s.audit.record(call).await.unwrap();
    }
    let log = s.audit.recent(10).await.unwrap();
    assert_eq!(log.len(), 2);
    assert_eq!(
        (
            log[0].tool.as_str(),
            log[0].outcome.as_str(),
            log[0].duration_us
        ),
        ("file_write", "denied", 42)
    );
    assert!(
        !log[0].arguments.contains("hunter2"),
        "{}",
        log[0].arguments
    );
    assert!(log[0].arguments.contains(REDACTED), "{}", log[0].arguments);
    assert_eq!(s.audit.recent(1).await.unwrap().len(), 1);
}

async fn receipts_are_kept_and_summed_alike(s: &Services) {
    let rows = [
        (
            Some("channel:a"),
            "worker:1",
            "fetch",
            "ok",
            Some(3 << 20),
            2,
            1,
        ),
        (
            Some("channel:a"),
            "channel:a",
            "fetch",
            "denied",
            None,
            0,
            2,
        ),
        (
            Some("channel:b"),
            "branch:2",
            "read",
            "ok",
            Some(1 << 20),
            0,
            0,
        ),
        (None, "mcp:ci", "fetch", "failed", Some(5 << 20), 1, 0),
    ];
    for (n, (conversation, process, tool, outcome, peak, requests, refused)) in
        rows.into_iter().enumerate()
    {
        let n = n as u64;
        let call = AuditRecord {
            conversation: conversation.map(Into::into),
            process: process.into(),
            tool: tool.into(),
            grants: String::new(),
            arguments: "{}".into(),
            outcome: outcome.into(),
            detail: String::new(),
            duration_us: 100 + n,
            receipt: Receipt {
                peak_memory_bytes: peak,
                bytes_in: 10 + n,
                bytes_out: 1000 * n,
                requests,
                requests_refused: refused,
                request_bytes_sent: 7 * u64::from(requests),
                request_bytes_received: 1 << (20 + n),
                // Counted only where an instance ran (and, on a host, with fuel on).
                fuel: peak.map(|_| 1000 * (n + 1)),
            },
        };
        s.audit.record(call).await.unwrap();
    }
    let log = s.audit.recent(10).await.unwrap();
    assert_eq!(log[0].conversation, None);
    assert_eq!(log[3].conversation.as_deref(), Some("channel:a"));
    assert_eq!(
        log[3].receipt,
        Receipt {
            peak_memory_bytes: Some(3 << 20),
            bytes_in: 10,
            bytes_out: 0,
            requests: 2,
            requests_refused: 1,
            request_bytes_sent: 14,
            request_bytes_received: 1 << 20,
            fuel: Some(1000),
        },
        "a receipt reads back as it was recorded"
    );
    assert_eq!(log[2].receipt.peak_memory_bytes, None);
    // The store's own sums agree with the rows summed one by one, for every grouping.
    let a = CostsOf {
        conversation: Some("channel:a".into()),
    };
    for by in [
        CostsBy::Conversation,
        CostsBy::Process,
        CostsBy::Tool,
        CostsBy::Day,
    ] {
        for of in [CostsOf::default(), a.clone()] {
            let summed = s.audit.costs(by, &of).await.unwrap();
            assert_eq!(summed, sum_costs(&log, by, &of), "by {by:?} of {of:?}");
        }
    }
    let by_conversation = s
        .audit
        .costs(CostsBy::Conversation, &CostsOf::default())
        .await
        .unwrap();
    let keys: Vec<Option<&str>> = by_conversation.iter().map(|c| c.key.as_deref()).collect();
    assert_eq!(keys, [None, Some("channel:a"), Some("channel:b")]);
    let channel_a = &by_conversation[1];
    assert_eq!(
        (
            channel_a.calls,
            channel_a.failed,
            channel_a.duration_us,
            channel_a.peak_memory_bytes,
            channel_a.requests,
            channel_a.requests_refused,
            channel_a.fuel,
        ),
        (2, 1, 201, Some(3 << 20), 2, 3, Some(1000))
    );
    // The first day is the day of the conversation's first call (`YYYY-MM-DD`, UTC).
    let by_day = s.audit.costs(CostsBy::Day, &a).await.unwrap();
    assert_eq!(by_day[0].key.as_deref(), Some(day_of(log[3].at).as_str()));
}

async fn conversations_workers_and_audit_pages_list_what_is_stored(s: &Services) {
    assert!(s.history.conversations().await.unwrap().is_empty());
    s.history
        .append(&key("channel:b"), vec!["1".into(), "2".into()])
        .await
        .unwrap();
    s.history
        .append(&key("channel:a"), vec!["1".into()])
        .await
        .unwrap();
    s.history
        .replace(&key("channel:gone"), Vec::new())
        .await
        .unwrap();
    let all = s.history.conversations().await.unwrap();
    let listed: Vec<(&str, u64)> = all
        .iter()
        .map(|c| (c.channel.as_str(), c.messages))
        .collect();
    assert_eq!(listed, [("channel:a", 1), ("channel:b", 2)]);

    let run = s.ledger.begin_run().await.unwrap();
    for n in 1..=3 {
        let id = format!("worker:{n}");
        s.ledger
            .worker_started(run.id(), &pid(&id), &pid("channel:a"), &format!("task {n}"))
            .await
            .unwrap();
    }
    s.ledger
        .set_worker_state(&pid("worker:2"), WorkerState::Done, Some("ok"))
        .await
        .unwrap();
    let workers = s.ledger.workers(2).await.unwrap();
    let listed: Vec<(String, WorkerState)> = workers
        .iter()
        .map(|w| (w.id.to_string(), w.state))
        .collect();
    assert_eq!(
        listed,
        [
            ("worker:3".to_owned(), WorkerState::Running),
            ("worker:2".to_owned(), WorkerState::Done)
        ],
        "newest first, in their state"
    );

    for n in 0..5 {
        let call = AuditRecord {
            process: "worker:1".into(),
            tool: format!("tool_{n}"),
            grants: String::new(),
            arguments: "{}".into(),
            outcome: "ok".into(),
            detail: String::new(),
            duration_us: 1,
            conversation: None,
            receipt: Receipt::default(),
        };
        s.audit.record(call).await.unwrap();
    }
    let first = s.audit.page(None, 2).await.unwrap();
    let tools = |page: &[super::AuditEntry]| -> Vec<String> {
        page.iter().map(|e| e.tool.clone()).collect()
    };
    assert_eq!(tools(&first), ["tool_4", "tool_3"]);
    assert!(first[0].id > first[1].id);
    let second = s.audit.page(Some(first[1].id), 2).await.unwrap();
    assert_eq!(tools(&second), ["tool_2", "tool_1"]);
    let last = s.audit.page(Some(second[1].id), 2).await.unwrap();
    assert_eq!(tools(&last), ["tool_0"]);
    assert!(s.audit.page(Some(last[0].id), 2).await.unwrap().is_empty());
}

async fn the_ledger_numbers_processes_and_interrupts_the_workers_of_ended_runs(s: &Services) {
    let l = &s.ledger;
    assert_eq!(l.next_process_number(ProcessKind::Worker).await.unwrap(), 1);
    assert_eq!(l.next_process_number(ProcessKind::Worker).await.unwrap(), 2);
    assert_eq!(l.next_process_number(ProcessKind::Branch).await.unwrap(), 1);
    let ended = l.begin_run().await.unwrap();
    let alive = l.begin_run().await.unwrap();
    assert_ne!(ended.id(), alive.id());
    for (run, id) in [(ended.id(), "worker:1"), (ended.id(), "worker:2")] {
        l.worker_started(run, &pid(id), &pid("channel:main"), "sort")
            .await
            .unwrap();
    }
    l.worker_started(alive.id(), &pid("worker:3"), &pid("channel:main"), "file")
        .await
        .unwrap();
    l.set_worker_state(&pid("worker:2"), WorkerState::Done, Some("3 items"))
        .await
        .unwrap();
    assert!(l.mark_interrupted_workers().await.unwrap().is_empty());
    let ended_id = ended.id();
    drop(ended);
    let marked = l.mark_interrupted_workers().await.unwrap();
    assert_eq!(marked.len(), 1, "{marked:?}");
    assert_eq!(
        (marked[0].id.to_string().as_str(), marked[0].state),
        ("worker:1", WorkerState::Interrupted)
    );
    let outcome = marked[0].outcome.clone().unwrap();
    assert!(outcome.contains(&ended_id.to_string()), "{outcome}");
    let done = l.worker(&pid("worker:2")).await.unwrap().unwrap();
    assert_eq!(
        (done.state, done.outcome.as_deref(), done.task.as_str()),
        (WorkerState::Done, Some("3 items"), "sort")
    );
    let live = l.worker(&pid("worker:3")).await.unwrap().unwrap();
    assert_eq!(
        live.state,
        WorkerState::Running,
        "a live run's worker is left alone"
    );
    assert_eq!(l.worker(&pid("worker:9")).await.unwrap(), None);
    let missing = l
        .set_worker_state(&pid("worker:9"), WorkerState::Done, None)
        .await;
    assert!(matches!(missing, Err(ServiceError::NotFound(_))));
    drop(alive);
}

async fn recall_matches_whole_words_of_kind_and_content_whatever_their_case(s: &Services) {
    let m = &s.memory;
    m.save(&by("b"), note("decision", "We fly to İstanbul", 0.5))
        .await
        .unwrap();
    for query in ["İstanbul", "we FLY", "decision"] {
        let found = m.recall(query, 5).await.unwrap();
        assert_eq!(found.len(), 1, "{query}: {found:?}");
    }
    assert!(
        m.recall("stan", 5).await.unwrap().is_empty(),
        "whole words only"
    );
    m.save(
        &by("b"),
        note(
            "fact",
            "Notes in CHANGES.md; ask bob@example.com about v1.2",
            0.5,
        ),
    )
    .await
    .unwrap();
    for query in ["changes", "md", "example", "bob", "v1"] {
        let found = m.recall(query, 5).await.unwrap();
        assert_eq!(
            found.len(),
            1,
            "a file name, an address and a version split into words: {query}"
        );
    }
}

async fn a_long_ttl_is_a_long_life(s: &Services) {
    for ttl in [u64::MAX, 1 << 63, i64::MAX as u64] {
        let trusted = Label::trusted();
        s.memory
            .working_set("k", "v", &trusted, Some(ttl))
            .await
            .unwrap();
        let got = s.memory.working_get("k").await.unwrap().map(|e| e.value);
        assert_eq!(got.as_deref(), Some("v"), "ttl {ttl}");
    }
}

async fn a_worker_is_recorded_once_and_its_end_is_final(s: &Services) {
    let l = &s.ledger;
    let run = l.begin_run().await.unwrap();
    l.worker_started(run.id(), &pid("worker:1"), &pid("channel:main"), "t")
        .await
        .unwrap();
    let again = l
        .worker_started(run.id(), &pid("worker:1"), &pid("channel:main"), "t")
        .await;
    assert!(
        matches!(&again, Err(ServiceError::Invalid(m)) if m.contains("worker:1")),
        "{again:?}"
    );
    l.set_worker_state(&pid("worker:1"), WorkerState::WaitingForInput, None)
        .await
        .unwrap();
    l.set_worker_state(&pid("worker:1"), WorkerState::Done, Some("ok"))
        .await
        .unwrap();
    let revived = l
        .set_worker_state(&pid("worker:1"), WorkerState::Running, None)
        .await;
    assert!(
        matches!(revived, Err(ServiceError::Invalid(_))),
        "{revived:?}"
    );
    let record = l.worker(&pid("worker:1")).await.unwrap().unwrap();
    assert_eq!(
        (record.state, record.outcome.as_deref()),
        (WorkerState::Done, Some("ok"))
    );
    drop(run);
}

/// Every backend: a live run owns what it claims, under an epoch that holds while it
/// does. A backend one host uses alone refuses to forward (that host owns every
/// session); one hosts share takes each forwarded message once, by the owner, and hands
/// each answer back once.
async fn a_run_owns_the_sessions_it_claims_and_forwarded_messages_are_taken_once(s: &Services) {
    let sessions = &s.sessions;
    let run = s.ledger.begin_run().await.unwrap();
    let main = key("channel:main");
    let Claim::Owned(epoch) = sessions.claim(&main, run.id()).await.unwrap() else {
        panic!("a live run claiming a session nobody owns owns it");
    };
    assert_eq!(
        sessions.claim(&main, run.id()).await.unwrap(),
        Claim::Owned(epoch),
        "a run keeps the session it owns, under the same epoch"
    );
    assert!(matches!(
        sessions.claim(&key("cortex:main"), run.id()).await.unwrap(),
        Claim::Owned(_)
    ));
    assert!(
        sessions
            .forwarded_sessions(run.id())
            .await
            .unwrap()
            .is_empty()
    );
    let nothing = sessions
        .take_forwarded(&main, run.id(), epoch)
        .await
        .unwrap();
    assert!(nothing.is_empty(), "{nothing:?}");
    assert_eq!(sessions.take_answer(ForwardId::new(1)).await.unwrap(), None);

    let message = Forwarded::User {
        text: "hello".into(),
        key: None,
        traceparent: None,
        label: crate::flow::Label::untrusted(crate::flow::Origin::chat("tg", "7")),
    };
    match sessions.forward(&main, &message).await {
        // One host alone owns every session: there is nowhere to forward to.
        Err(ServiceError::Invalid(why)) => assert!(why.contains("channel:main"), "{why}"),
        Err(other) => panic!("a refused forward is Invalid, naming the session: {other}"),
        Ok(id) => {
            assert_eq!(
                sessions.forwarded_sessions(run.id()).await.unwrap(),
                std::slice::from_ref(&main)
            );
            let taken = sessions.take_forwarded(&main, run.id(), epoch).await;
            assert_eq!(taken.unwrap(), [(id, message)]);
            let again = sessions.take_forwarded(&main, run.id(), epoch).await;
            assert!(again.unwrap().is_empty(), "a message is taken once");
            let answer = Answer {
                reply: "hi".into(),
                ..Answer::default()
            };
            sessions.answer(id, &answer).await.unwrap();
            assert_eq!(sessions.take_answer(id).await.unwrap(), Some(answer));
            assert_eq!(
                sessions.take_answer(id).await.unwrap(),
                None,
                "an answer is taken once"
            );
            // A run that is over claims nothing.
            let over = run.id();
            drop(run);
            s.ledger.settle().await;
            let refused = sessions.claim(&key("channel:other"), over).await;
            assert!(
                matches!(refused, Err(ServiceError::Invalid(_))),
                "{refused:?}"
            );
        }
    }
}

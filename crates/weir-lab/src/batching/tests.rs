use super::*;

#[test]
fn sizes_parse_ranges_and_lists() {
    assert_eq!("2..5".parse::<Sizes>().unwrap().0, vec![2, 3, 4, 5]);
    assert_eq!("2..=3".parse::<Sizes>().unwrap().0, vec![2, 3]);
    assert_eq!("2, 5,10".parse::<Sizes>().unwrap().0, vec![2, 5, 10]);
    assert!("5..2".parse::<Sizes>().is_err());
    assert!("0,2".parse::<Sizes>().is_err());
    assert!("x".parse::<Sizes>().is_err());
}

fn tiny_job() -> Job {
    Job {
        records: 10,
        record_bytes: 100,
        interval: Duration::from_millis(1),
        link: Link {
            per_transaction: Duration::from_millis(50),
            bytes_per_sec: 100_000.0,
        },
    }
}

#[tokio::test(start_paused = true)]
async fn fixed_buffers_flush_the_remainder_at_the_end_of_the_job() {
    let run = run_job(tiny_job(), &mut Closing::Sizes(vec![4])).await;
    assert_eq!(run.batch_sizes(), vec![4, 4, 2]);
    assert_eq!(run.arrivals.len(), 10);
    // Virtual time: the first batch leaves at 3 ms and takes 54 ms;
    // the others were buffered by then.
    assert_eq!(run.wall, Duration::from_millis(3 + 54 + 54 + 52));
}

#[tokio::test(start_paused = true)]
async fn fifs_sends_one_record_per_transaction() {
    let run = run_job(tiny_job(), &mut Closing::Sizes(vec![1])).await;
    assert_eq!(run.batch_sizes(), vec![1; 10]);
    assert_eq!(run.wall, Duration::from_millis(10 * 51));
}

/// The paper's job on the paper's Eq. 3 link.
fn paper_job() -> Job {
    Job {
        records: 50,
        record_bytes: 1400,
        interval: Duration::from_millis(10),
        link: Link {
            per_transaction: Duration::from_secs_f64(PAPER_EQ3_INTERCEPT_MS / 1e3),
            bytes_per_sec: 1400.0 / (PAPER_EQ3_SLOPE_MS / 1e3),
        },
    }
}

#[tokio::test(start_paused = true)]
async fn the_online_plan_learns_the_link_and_batches_on_what_it_learned() {
    let job = paper_job();
    let fifs = run_job(job, &mut Closing::Sizes(vec![1])).await;
    let mut closing = Closing::Online(Box::new(Online::new(Duration::from_secs(10), 2).unwrap()));
    let first = run_job(job, &mut closing).await;
    let mut later = Vec::new();
    for _ in 0..2 {
        tokio::time::sleep(RELAY_PAUSE).await;
        later.push(run_job(job, &mut closing).await);
    }
    let second = &later[1];
    let Closing::Online(o) = &closing else {
        unreachable!()
    };
    // The fits recover the link from weir's wrong priors (18 Mbit/s,
    // 50 ms) using only the jobs' own transactions.
    let line = o.upload_line(1400.0);
    assert!((line.fixed - 0.27752).abs() < 0.01, "{line:?}");
    assert!((line.per_unit - 0.0050393).abs() < 0.0005, "{line:?}");
    for run in [&first, &later[0], second] {
        let sent: u32 = run.batch_sizes().iter().sum();
        assert_eq!(sent, 50, "every record sent once");
        // Every close is recorded, and stays within the byte cap.
        assert_eq!(run.plans.len(), run.transactions.len());
        for p in &run.plans {
            assert!(
                p.sent == 1 || u64::from(p.sent) * 1400 <= p.plan.max_bytes,
                "{p:?}"
            );
        }
    }
    // After learning, the plan batches and the job beats FIFS by far.
    assert!(
        second.plans.iter().any(|p| p.plan.batches() && p.sent > 1),
        "{:?}",
        second.plans
    );
    assert!(
        second.wall * 4 < fifs.wall,
        "{:?} vs {:?}",
        second.wall,
        fifs.wall
    );
}

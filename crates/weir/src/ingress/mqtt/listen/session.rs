//! Persistent sessions (MQTT 3.1.1 `clean_session = 0`, MQTT 5
//! `clean_start = 0`): what weir remembers of a client between its
//! connections so that a resend after a reconnect is not recorded twice.
//!
//! weir relays and delivers nothing to subscribers, so a session holds
//! only the receiving side's packet-id state:
//! - **QoS 1**: for each packet id, a fingerprint (topic and payload) of
//!   the last publish accepted with it. A PUBLISH with DUP set, a packet id
//!   in the session and the same fingerprint is a resend whose PUBACK was
//!   lost with the connection: it is acknowledged again, not queued again.
//!   Without DUP, or with another fingerprint, it is a new record. (The
//!   one case this gets wrong: a client whose PUBACK arrived, that reused
//!   the id for a *byte-identical* publish, lost that one in transit and
//!   resent it; weir then keeps one copy of two identical records.)
//! - **QoS 2**: the packet ids whose PUBREC was sent and whose PUBREL has
//!   not come; a resend of one of these is not queued again.
//!
//! A client id is held by one connection at a time: a new connection with
//! the id stops the old one (MQTT's session takeover) and waits for it to
//! hand the session back, so a client that reconnects before weir noticed
//! its old connection die still resumes its session.
//!
//! Sessions live in memory only: a restart of weir forgets them, and a
//! resend after one is a duplicate (same payload, new sequence number),
//! as QoS 1's at-least-once allows. At most [`MAX_SESSIONS`] are kept;
//! beyond that the least recently stored is forgotten.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use crate::spool::Ticket;

/// The session a client keeps: its packet-id state ([`super::state`]).
pub(super) type Session = super::state::Session<Ticket>;

/// Sessions kept for clients that are not connected.
pub(super) const MAX_SESSIONS: usize = 10_000;

/// How long a connecting client waits for the connection it takes over
/// to hand its session back (that one first settles the acknowledgements
/// it holds); after this it goes on with a new session.
pub(super) const TAKEOVER_WAIT: Duration = Duration::from_secs(5);

/// Every client id connected now, and the sessions of those that are not.
#[derive(Debug, Default)]
pub(crate) struct Sessions {
    inner: Mutex<Stored>,
    /// Woken whenever a connection ends.
    ended: Notify,
    next_id: AtomicU64,
}

#[derive(Debug, Default)]
struct Stored {
    by_client: HashMap<String, Session>,
    /// Client ids in the order their sessions were stored (may hold ids
    /// taken since; skipped when found stale).
    order: VecDeque<String>,
    /// Connections holding a client id now: their id, and how to stop
    /// them.
    live: HashMap<String, (u64, CancellationToken)>,
}

impl Sessions {
    /// An id for a new connection.
    pub(super) fn next_id(&self) -> u64 {
        self.next_id.fetch_add(1, Ordering::Relaxed)
    }

    /// Connection `me` connects as `client_id`. A connection still
    /// holding that id is stopped (MQTT's session takeover) and its
    /// session awaited, up to [`TAKEOVER_WAIT`]. Returns the session to
    /// resume (and `true`: "session present") or a new one; `clean`
    /// discards any stored session. Until [`Sessions::end`], a later
    /// connection with this id stops `me` through `kick`.
    pub(super) async fn resume(
        &self,
        client_id: &str,
        clean: bool,
        me: u64,
        kick: &CancellationToken,
    ) -> (Session, bool) {
        let give_up = tokio::time::Instant::now() + TAKEOVER_WAIT;
        loop {
            let ended = self.ended.notified();
            tokio::pin!(ended);
            ended.as_mut().enable();
            {
                let mut s = self.lock();
                let holder = s.live.get(client_id).cloned();
                match holder {
                    Some((other, old)) if other != me && tokio::time::Instant::now() < give_up => {
                        old.cancel();
                    }
                    _ => {
                        s.live.insert(client_id.to_owned(), (me, kick.clone()));
                        return match s.by_client.remove(client_id) {
                            Some(session) if !clean => (session, true),
                            _ => (Session::default(), false),
                        };
                    }
                }
            }
            // Cancel safety: only waits.
            let _ = tokio::time::timeout_at(give_up, ended).await;
        }
    }

    /// Connection `me` as `client_id` ended; `session` (persistent
    /// sessions only) is kept until the client reconnects.
    pub(super) fn end(&self, client_id: String, me: u64, session: Option<Session>) {
        let mut s = self.lock();
        let mine = s.live.get(&client_id).is_some_and(|(id, _)| *id == me);
        if mine {
            s.live.remove(&client_id);
        }
        // A connection that took the id over after the wait gave up has
        // its own session now; this one's is stale.
        if let Some(session) = session.filter(|_| mine) {
            while s.by_client.len() >= MAX_SESSIONS {
                let Some(oldest) = s.order.pop_front() else {
                    break;
                };
                s.by_client.remove(&oldest);
            }
            s.order.push_back(client_id.clone());
            s.by_client.insert(client_id, session);
            // Ids taken back since they were stored pile up in `order`:
            // trim them now and then so it stays about as long as the map.
            if s.order.len() > 2 * MAX_SESSIONS {
                let Stored {
                    by_client, order, ..
                } = &mut *s;
                order.retain(|id| by_client.contains_key(id));
            }
        }
        drop(s);
        self.ended.notify_waiters();
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Stored> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn sessions_resume_unless_clean_and_are_bounded() {
        let sessions = Sessions::default();
        let kick = CancellationToken::new();
        let connect = |clean| {
            let id = sessions.next_id();
            let kick = kick.clone();
            let sessions = &sessions;
            async move {
                let (session, present) = sessions.resume("dev", clean, id, &kick).await;
                (id, session, present)
            }
        };
        let (id, mut s, present) = connect(false).await;
        assert!(!present);
        s.accepted(1, 42, None);
        sessions.end("dev".into(), id, Some(s));
        let (id, back, present) = connect(false).await;
        assert!(present);
        assert!(back.resend(true, 1, 42).is_some());
        sessions.end("dev".into(), id, Some(back));
        let (id, _, present) = connect(true).await;
        assert!(!present, "clean discards it");
        sessions.end("dev".into(), id, None);
        assert!(!connect(false).await.2);
    }

    #[tokio::test]
    async fn a_second_connection_takes_the_session_over() {
        let sessions = std::sync::Arc::new(Sessions::default());
        let (first, first_kick) = (sessions.next_id(), CancellationToken::new());
        let (mut s, _) = sessions.resume("dev", false, first, &first_kick).await;
        s.accepted(9, 7, None);
        // The first connection ends (hands its session back) once kicked.
        let holder = {
            let sessions = sessions.clone();
            let kick = first_kick.clone();
            tokio::spawn(async move {
                kick.cancelled().await;
                sessions.end("dev".into(), first, Some(s));
            })
        };
        let second = sessions.next_id();
        let (s, present) = sessions
            .resume("dev", false, second, &CancellationToken::new())
            .await;
        assert!(first_kick.is_cancelled());
        assert!(present);
        assert!(s.resend(true, 9, 7).is_some());
        holder.await.unwrap();
    }

    #[test]
    fn the_oldest_stored_sessions_are_forgotten_beyond_the_cap() {
        let sessions = Sessions::default();
        let kick = CancellationToken::new();
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        for i in 0..MAX_SESSIONS + 10 {
            let id = format!("c{i}");
            rt.block_on(sessions.resume(&id, false, i as u64, &kick));
            sessions.end(id, i as u64, Some(Session::default()));
        }
        assert!(!rt.block_on(sessions.resume("c0", false, 1 << 40, &kick)).1);
        let last = format!("c{}", MAX_SESSIONS + 9);
        assert!(rt.block_on(sessions.resume(&last, false, 1 << 41, &kick)).1);
    }
}

//! Peering without a coordinator: JANUS Section V-B (bandwidth tuples,
//! Algorithm 3 and its baselines, the reservation of Fig. 4) run by every
//! node over its own view of the others, each provider being the only
//! authority over its own spare.
//!
//! JANUS collects every node's tuple at a central orchestrator (a primary
//! with hot standbys) that runs the matcher and tells receivers and
//! providers what to do; the paper names that orchestrator as its
//! bottleneck (Section VI, "Scalability"). Here every node:
//! 1. advertises its PBTT tuple on heartbeats (to every peer, or by gossip
//!    to a few, [`gossip`]) and keeps the latest [`Advert`] of every peer in
//!    a [`PeerView`]; a peer not heard from for `dead_after` is gone;
//! 2. each round runs the *same* deterministic matcher ([`redirect()`](crate::janus::redirect())) over
//!    its view plus its own tuple ([`decide`]) and keeps only the grants in
//!    which it is the receiver;
//! 3. asks each of those providers to reserve the granted rate for a lease.
//!    The provider grants at most the spare it has not already reserved for
//!    others ([`Reservations::grant`]), shifts its allocation as in Fig. 4
//!    ([`Reserved::shift`]), and admits forwarded records only within a
//!    token bucket at the granted rate ([`Reservations::admit`]);
//! 4. sends at most the granted rate ([`Leases`]) and keeps every record it
//!    sent until the provider acknowledges it ([`InFlight`]); the provider
//!    acknowledges a record only once it has delivered it ([`Custody`]).
//!
//! Why no coordinator is needed: views may be stale or differ between nodes
//! (a heartbeat lost, a peer seen dead by one node and alive by another),
//! so two receivers may both be matched to the same spare. The provider
//! then grants the first and refuses what no longer fits; a receiver whose
//! lease was cut short has its records refused and takes them back. Either
//! way the cost is an unused reservation or a refused record, never a
//! provider carrying more than the spare it had when it said yes.
//!
//! Units are whatever the tuples use (weir: bytes/s; a record counts for
//! [`Record::size`](crate::record::Record::size) bytes); time is a [`Duration`](std::time::Duration) since any epoch the
//! caller picks.
//!
//! # Layout
//! - `peer/state.rs`: the node's own bandwidth as its scheduler last computed
//!   it ([`BandwidthState`]) and the advert it sends peers ([`Advert`]).
//! - `peer/view.rs`: what a node knows of its peers: the latest advert of each,
//!   and which are alive ([`PeerView`]).
//! - `peer/gossip.rs`: adverts spread by gossip (a few partners a period, each
//!   relayed advert with its age) instead of to every peer, for large
//!   clusters ([`gossip::partners`], [`gossip::table`]).
//! - `peer/round.rs`: one redirection round as a node decides it alone: the
//!   shared matcher over its view ([`decide`]), and which providers to ask
//!   ([`first_asks`], [`spill_asks`]).
//! - `peer/pacing.rs`: how a granted rate becomes a token bucket ([`Pacing`]),
//!   for providers and receivers alike.
//! - `peer/spare.rs`: what a node may lend ([`lendable`]), what it is short of
//!   its own ([`own_shortage`]) and what it advertises ([`advertised`]).
//! - `peer/period.rs`: heartbeat periods aligned on the Unix clock, so every
//!   node matches on the same period's tuples.
//! - `peer/own_rate.rs`: the node's own arrival rate, peers' records excluded,
//!   smoothed ([`OwnRate`]).
//! - `peer/reservation.rs`: a provider's reservations: grants within its
//!   unreserved spare, the shift of its allocation (Fig. 4), and admission of
//!   forwarded records within each reservation's rate ([`Reservations`]).
//! - `peer/lease.rs`: a receiver's leases: the rates providers granted it, and
//!   the pacing of what it sends under them ([`Leases`]).
//! - `peer/in_flight.rs`: records a receiver sent and a provider has not yet
//!   acknowledged ([`InFlight`]).
//! - `peer/custody.rs`: a provider's custody of forwarded records until its
//!   egress delivers them ([`Custody`]).

mod custody;
pub mod gossip;
mod in_flight;
mod lease;
mod own_rate;
mod pacing;
mod period;
mod reservation;
mod round;
mod spare;
mod state;
#[cfg(test)]
mod tests;
mod view;

pub use custody::{Custody, StreamId};
pub use in_flight::{key_of, provider_lost, InFlight, RecordKey};
pub use lease::Leases;
pub use own_rate::{OwnRate, OWN_RATE_TAU};
pub use pacing::Pacing;
pub use period::{
    heartbeat_offset, period_of, until_heartbeat, until_period, MAX_HEARTBEAT_JITTER,
};
pub use reservation::{Admission, ReservationConfig, Reservations, Reserved, FLOW_WINDOW};
pub use round::{
    decide, first_asks, match_nodes, offers_in, spill_asks, Refusals, Spill, MAX_SPILL_STEPS,
    REFUSAL_MEMORY,
};
pub use spare::{advertised, lendable, own_shortage, LEND_SHARE};
pub use state::{Advert, BandwidthState};
pub use view::{Observed, PeerView};

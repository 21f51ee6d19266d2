//! What a node may lend ([`lendable`]), what it is short of its own
//! ([`own_shortage`]) and what it advertises ([`advertised`]).

use super::state::BandwidthState;
use crate::janus::redirect::MIN_AMOUNT;
use crate::janus::{non_negative, BandwidthTuple};

/// The share of what a provider could lend that it offers: the rest is
/// headroom for its own classes' bursts, so carrying for peers does not
/// make the provider short itself (its Eq. 22 demands then turn it into a
/// receiver, and lent records travel on).
///
/// `C_out` already sits 1.5 % under the uplink estimate
/// ([`UPLINK_HEADROOM`](crate::scheduler::UPLINK_HEADROOM)), and the
/// provider's own classes come first in its drain whatever it lent. At
/// 0.9, in the real-process JANUS lab, providers' links carried 0.84-0.91
/// of the shaped rate while both busy nodes' `lt` waited, and PMRFS
/// delivered on average 94.2 % of the cluster's limit at 720 B (34 cells);
/// at 0.97 the providers carry 0.95 and PMRFS 98.6 % at 720 B and 95.5 %
/// at 1 KiB (fifteen cells each, 94.1-99.8 %), `ls` late 0-4 % either way.
pub const LEND_SHARE: f64 = 0.97;

/// What a provider can lend: [`LEND_SHARE`] of the capacity its own
/// traffic leaves, `C_out - own_rate`. Peers' traffic is bounded by the
/// reservations it grants from that, so the node's load stays below
/// `C_out` with the rest as headroom for its own bursts.
///
/// While the node is late (a class broke its bound by Eq. 1, e.g. the
/// uplink is slower than `C_out` says), it lends no more than its PBTT
/// tuple shows: [`LEND_SHARE`] of its spare plus what its reservations
/// carry now ([`Reservations::carried`](crate::peer::Reservations::carried): the tuple's Eq. 22 demands
/// already count those records as load), less its shortage. Renewals then
/// shrink until it catches up.
///
/// Why not the tuple always: Eq. 2's `s_c / t` counts whatever sits in
/// the queue at a window's end as throughput, and forwarded records arrive
/// in bunches (a Forward request carries up to 256 KiB), so on a provider
/// the tuple's spare swung by the size of a bunch from window to window.
/// In the JANUS lab an idle provider able to lend 1.9 MB/s advertised
/// about 1 MB/s on average, anywhere between 0.1 and 1.9.
pub fn lendable(state: &BandwidthState, carried: f64) -> f64 {
    let leaves = non_negative(LEND_SHARE * (state.capacity - non_negative(state.own_rate)));
    if !state.late {
        return leaves;
    }
    let tuple = &state.tuple;
    let shown = non_negative(
        LEND_SHARE * (tuple.spare_total() + non_negative(carried)) - tuple.shortage_total(),
    );
    leaves.min(shown)
}

/// The shortage a node asks peers for, per class (JANUS tuple entries,
/// negative): its PBTT tuple's, less the part that what it `carried` for
/// peers explains. That part it sheds by lending less ([`lendable`]),
/// rather than passing lent records on to a third node.
///
/// A node carrying for peers that is not late and whose own traffic leaves
/// it something to lend has no shortage of its own at all: its tuple's is
/// the bunching of forwarded records (see [`lendable`]), which reached
/// twice the rate it carried for a window at a time. Advertised, it turned
/// the provider into a receiver for that round, and every renewal it
/// answered meanwhile was granted nothing.
pub fn own_shortage(state: &BandwidthState, carried: f64) -> BandwidthTuple {
    let tuple = &state.tuple;
    let shortage = tuple.shortage_total();
    let carrying = carried > MIN_AMOUNT;
    let settled = carrying && !state.late && LEND_SHARE * state.capacity > state.own_rate;
    if shortage <= 0.0 || settled {
        return BandwidthTuple(vec![0.0; tuple.0.len()]);
    }
    let own = non_negative(shortage - non_negative(carried)) / shortage;
    BandwidthTuple(
        tuple
            .0
            .iter()
            .map(|&b| if b < 0.0 { b * own } else { 0.0 })
            .collect(),
    )
}

/// The tuple a node advertises, from its scheduler's `state`, what it
/// `carried` for peers (measured) and what it `reserved` for them: the
/// shortage it asks peers for ([`own_shortage`], which counts what it
/// reserved as carried, so that a reservation not yet measured as
/// carrying does not make it ask for help with peers' records), or, when
/// it has none of its own, its spare entries scaled to sum to what it can
/// lend ([`lendable`]; all in the top class when it has no spare entry).
/// Never both asks and offers.
///
/// Counting only the measured rate (over 250 ms), a provider in its first
/// window of a new reservation saw the bunching of forwarded records as
/// its own shortage and passed records on to the other provider, which
/// sometimes sent them back.
pub fn advertised(state: &BandwidthState, carried: f64, reserved: f64) -> BandwidthTuple {
    let local = &state.tuple;
    let own = own_shortage(state, carried.max(reserved));
    if own.shortage_total() > 0.0 {
        return own;
    }
    let lendable = lendable(state, carried);
    let mut t = BandwidthTuple(local.0.iter().map(|b| b.max(0.0)).collect());
    let spare = t.spare_total();
    if spare > 0.0 {
        t.0.iter_mut().for_each(|b| *b *= lendable / spare);
    } else if let Some(top) = t.0.first_mut() {
        *top = lendable;
    }
    t
}

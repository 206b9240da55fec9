//! Redlock's decisions, apart from the sending: what a majority of the masters' answers comes
//! to, for each step. An acquire's answers counted into a [`Tally`] and [`decide`]d; a renewal's
//! per lease ([`Renewals`]); a hand-over's ([`HandOvers`]); a release's, a leave's, any step that
//! needs a majority to answer ([`majority_answered`]). Pure, so every branch is tested without a
//! server.

use std::time::Duration;

use super::super::{HandOver, Renewal, StoreError};
use crate::error::LostReason;

/// How many of `masters` masters make a majority.
pub(super) fn majority(masters: usize) -> usize {
    masters / 2 + 1
}

/// Whether `agreeing` answers of `answered`, over `masters` masters, settle a step: a majority
/// agrees, or so many answered otherwise that a majority never can.
pub(super) fn settled(agreeing: usize, answered: usize, masters: usize) -> bool {
    let quorum = majority(masters);
    agreeing >= quorum || answered - agreeing > masters - quorum
}

/// Whether a majority answered a step (`answers`, by master; `quorum`); when not, the first
/// master's error, or [`StoreError::NoQuorum`].
pub(super) fn majority_answered<T>(
    answers: &[(usize, Result<T, StoreError>)],
    quorum: usize,
) -> Result<(), StoreError> {
    let answered = answers.iter().filter(|(_, answer)| answer.is_ok()).count();
    if answered >= quorum {
        return Ok(());
    }
    let errors = answers
        .iter()
        .filter_map(|(_, answer)| answer.as_ref().err());
    Err(StoreError::short_of_quorum(
        errors.cloned().map(Err::<(), _>),
        answered,
        quorum,
    ))
}

/// The masters' answers to one lease's renewal, counted.
#[derive(Debug, Default)]
pub(super) struct Renewals {
    extended: usize,
    lost: usize,
    /// Some master that lost it names another owner.
    taken: bool,
    /// The last failure heard, if any.
    failure: Option<StoreError>,
}

impl Renewals {
    pub(super) fn of<'r>(outcomes: impl IntoIterator<Item = &'r Renewal>) -> Self {
        let mut renewals = Self::default();
        for outcome in outcomes {
            match outcome {
                Renewal::Extended => renewals.extended += 1,
                Renewal::Lost(reason) => {
                    renewals.lost += 1;
                    renewals.taken |= *reason == LostReason::Taken;
                }
                Renewal::Failed(error) => renewals.failure = Some(error.clone()),
            }
        }
        renewals
    }

    /// Whether a majority agrees, either way: the others' answers change nothing.
    pub(super) fn decided(&self, quorum: usize) -> bool {
        self.extended >= quorum || self.lost >= quorum
    }

    /// Extended when a majority extended it, lost when a majority lost it (taken when any of
    /// them names another owner), otherwise failed: retried before the lease's deadline.
    pub(super) fn outcome(self, quorum: usize) -> Renewal {
        if self.extended >= quorum {
            Renewal::Extended
        } else if self.lost >= quorum {
            Renewal::Lost(match self.taken {
                true => LostReason::Taken,
                false => LostReason::Gone,
            })
        } else {
            Renewal::Failed(self.failure.unwrap_or(StoreError::NoQuorum {
                answered: self.extended.max(self.lost),
                needed: quorum,
            }))
        }
    }
}

/// The masters' answers to a hand-over, counted.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(super) struct HandOvers {
    pub(super) handed: usize,
    released: usize,
    to_reservation: usize,
    pub(super) not_ours: usize,
}

impl HandOvers {
    pub(super) fn of<'r>(
        answers: impl IntoIterator<Item = &'r Result<HandOver, StoreError>>,
    ) -> Self {
        let mut counts = Self::default();
        for answer in answers {
            match answer {
                Ok(HandOver::Handed) => counts.handed += 1,
                Ok(HandOver::Released) => counts.released += 1,
                Ok(HandOver::ToReservation) => counts.to_reservation += 1,
                Ok(HandOver::NotOurs) => counts.not_ours += 1,
                Err(_) => {}
            }
        }
        counts
    }

    /// The masters that answered.
    pub(super) fn answered(&self) -> usize {
        self.handed + self.released + self.to_reservation + self.not_ours
    }

    /// Handed when a majority handed it. Otherwise (the next holder's value is taken back
    /// wherever it landed) not ours when a majority says so, handed to a reservation when a
    /// majority did, released when it is gone from a majority (freed, or passed to a waiter
    /// it is reserved for); `None` when no majority agrees on any of these.
    pub(super) fn outcome(&self, quorum: usize) -> Option<HandOver> {
        if self.handed >= quorum {
            Some(HandOver::Handed)
        } else if self.not_ours >= quorum {
            Some(HandOver::NotOurs)
        } else if self.to_reservation >= quorum {
            Some(HandOver::ToReservation)
        } else if self.handed + self.released + self.to_reservation >= quorum {
            Some(HandOver::Released)
        } else {
            None
        }
    }
}

/// A master's `Busy`: the first busy key, the time until it may be free, the estimated wait.
pub(super) type BusyAnswer = (usize, Option<Duration>, Option<Duration>);

/// What one master answered an attempt, as far as the decision goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Answer {
    /// It took the key. `counts`: not a master restarted within the lease's ttl, which may
    /// have lost a lease taken on a bare majority (the Redlock paper's delayed restart, kept by
    /// the clients): its take holds the key but does not count toward the majority.
    Took { counts: bool },
    /// Another holder has it.
    Busy,
    /// Something that is no lock sits under the key.
    NotALock,
    /// An error, or out of the path.
    Failed,
    /// No answer yet.
    Unknown,
}

/// The masters' answers to one attempt, counted.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(super) struct Tally {
    /// Masters that took the key.
    pub(super) took: usize,
    /// Of those, the takes that count toward a majority.
    pub(super) counted: usize,
    pub(super) busy: usize,
    pub(super) not_a_lock: bool,
    /// Masters not answered yet.
    pub(super) unknown: usize,
}

impl Tally {
    pub(super) fn add(&mut self, answer: Answer) {
        match answer {
            Answer::Took { counts } => {
                self.took += 1;
                self.counted += usize::from(counts);
            }
            Answer::Busy => self.busy += 1,
            Answer::NotALock => self.not_a_lock = true,
            Answer::Failed => {}
            Answer::Unknown => self.unknown += 1,
        }
    }

    /// The masters still unanswered count as failed: the decision is taken now, their
    /// answers are late ones.
    pub(super) fn closed(self) -> Self {
        Self { unknown: 0, ..self }
    }
}

/// What an attempt comes to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Decision {
    /// The unanswered masters could still change it.
    Wait,
    /// Taken on a majority, with time left.
    Taken,
    /// Something that is no lock sits under the key on some master.
    NotALock,
    /// A majority found it busy (`raced`: we took some masters too, so others may be racing
    /// us for the rest; see [`busy`]).
    Busy { raced: bool },
    /// A majority took it, past the lease's validity.
    TooLate,
    /// A majority answered, split between us and another holder or racer (or taken on
    /// masters restarted too lately to count): look again soon.
    Split,
    /// No majority answered either way.
    NoQuorum { answered: usize },
}

/// Decides an attempt over `tally` (`validity`: the time the lease has left, if any), waiting
/// only while the unanswered masters could change the outcome: not once a majority counted,
/// nor once a majority is out of reach and a majority answered (busy, or split between us and
/// others) or is out of reach too.
pub(super) fn decide(tally: &Tally, quorum: usize, validity: Option<Duration>) -> Decision {
    let Tally {
        took,
        counted,
        busy,
        not_a_lock,
        unknown,
    } = *tally;
    let settled = counted >= quorum
        || (counted + unknown < quorum
            && (counted + busy >= quorum || counted + busy + unknown < quorum));
    if !settled {
        Decision::Wait
    } else if counted >= quorum && validity.is_some() {
        Decision::Taken
    } else if not_a_lock {
        Decision::NotALock
    } else if busy >= quorum {
        Decision::Busy { raced: took > 0 }
    } else if counted >= quorum {
        Decision::TooLate
    } else if took + busy >= quorum {
        Decision::Split
    } else {
        Decision::NoQuorum {
            answered: counted.max(busy),
        }
    }
}

/// When a key a majority found busy (`answers`, at least a majority of them) is free again, as
/// that majority sees it, over `masters` masters: the first busy key, and the times by which all but a minority of the busy masters
/// are free. `retry` (a racer's jittered look again) caps the time left.
pub(super) fn busy(
    answers: &[BusyAnswer],
    masters: usize,
    quorum: usize,
    retry: Option<Duration>,
) -> BusyAnswer {
    let key = answers.iter().map(|(key, ..)| *key).min().unwrap_or(0);
    let frees_a_majority = answers.len() - (masters - quorum);
    let majority_view = |pick: fn(&BusyAnswer) -> Option<Duration>| {
        let mut times: Vec<Option<Duration>> = answers.iter().map(pick).collect();
        times.sort_unstable();
        times.get(frees_a_majority - 1).copied().flatten()
    };
    let mut remaining = majority_view(|(_, left, _)| *left);
    let estimate = majority_view(|(.., estimate)| *estimate);
    if let Some(retry) = retry {
        remaining = Some(remaining.map_or(retry, |left| left.min(retry)));
    }
    (key, remaining, estimate)
}

#[cfg(test)]
mod tests {
    use super::*;

    const OURS: Answer = Answer::Took { counts: true };
    const RESTARTED: Answer = Answer::Took { counts: false };
    const LEFT: Option<Duration> = Some(Duration::from_millis(900));

    fn tally(answers: &[Answer]) -> Tally {
        let mut tally = Tally::default();
        answers.iter().for_each(|answer| tally.add(*answer));
        tally
    }

    fn decided(answers: &[Answer]) -> Decision {
        decide(&tally(answers), answers.len() / 2 + 1, LEFT)
    }

    use Answer::{Busy, Failed, NotALock, Unknown};

    #[test]
    fn a_bare_majority_takes_it_before_the_others_answer() {
        assert_eq!(decided(&[OURS, OURS, Unknown]), Decision::Taken);
        assert_eq!(
            decided(&[OURS, OURS, OURS, Unknown, Unknown]),
            Decision::Taken
        );
        assert_eq!(decided(&[OURS, OURS, Busy, Failed, Busy]), Decision::Split);
    }

    #[test]
    fn one_short_of_a_majority_waits_while_it_may_still_be_reached() {
        assert_eq!(decided(&[OURS, Unknown, Unknown]), Decision::Wait);
        assert_eq!(decided(&[OURS, Busy, Unknown]), Decision::Wait);
        assert_eq!(decided(&[OURS, OURS, Busy, Busy, Unknown]), Decision::Wait);
    }

    #[test]
    fn a_restarted_masters_take_holds_the_key_but_does_not_count() {
        assert_eq!(decided(&[OURS, RESTARTED, Unknown]), Decision::Wait);
        assert_eq!(decided(&[OURS, RESTARTED, Busy]), Decision::Split);
        assert_eq!(decided(&[OURS, RESTARTED, OURS]), Decision::Taken);
        assert_eq!(decided(&[RESTARTED, RESTARTED, Failed]), Decision::Split);
        let restarted = tally(&[RESTARTED, OURS, Unknown]);
        assert_eq!((restarted.took, restarted.counted), (2, 1));
    }

    #[test]
    fn a_majority_busy_is_busy_and_says_whether_we_raced() {
        assert_eq!(
            decided(&[Busy, Busy, Unknown]),
            Decision::Busy { raced: false }
        );
        assert_eq!(decided(&[Busy, Busy, OURS]), Decision::Busy { raced: true });
        assert_eq!(
            decided(&[Busy, Busy, Busy, Unknown, Unknown]),
            Decision::Busy { raced: false }
        );
    }

    #[test]
    fn a_majority_split_between_us_and_others_looks_again() {
        assert_eq!(decided(&[OURS, Busy, Failed]), Decision::Split);
        assert_eq!(decided(&[OURS, OURS, Busy, Busy, Failed]), Decision::Split);
    }

    #[test]
    fn something_that_is_no_lock_wins_over_busy_and_split_but_not_over_taken() {
        assert_eq!(decided(&[NotALock, Busy, Busy]), Decision::NotALock);
        assert_eq!(decided(&[NotALock, OURS, Busy]), Decision::NotALock);
        assert_eq!(decided(&[NotALock, OURS, OURS]), Decision::Taken);
        assert_eq!(decided(&[NotALock, Unknown, Unknown]), Decision::Wait);
    }

    #[test]
    fn a_majority_taken_too_late_is_an_error() {
        let late = decide(&tally(&[OURS, OURS, Busy]), 2, None);
        assert_eq!(late, Decision::TooLate);
        let busy_anyway = decide(&tally(&[OURS, OURS, OURS, Busy, Busy]), 3, None);
        assert_eq!(busy_anyway, Decision::TooLate);
    }

    #[test]
    fn no_majority_answering_is_no_quorum_as_soon_as_it_is_out_of_reach() {
        assert_eq!(
            decided(&[Failed, Failed, Unknown]),
            Decision::NoQuorum { answered: 0 }
        );
        assert_eq!(
            decided(&[OURS, Failed, Failed]),
            Decision::NoQuorum { answered: 1 }
        );
        assert_eq!(
            decided(&[Busy, Failed, Failed]),
            Decision::NoQuorum { answered: 1 }
        );
        assert_eq!(decided(&[Failed, Unknown, Unknown]), Decision::Wait);
    }

    #[test]
    fn a_closed_tally_never_waits() {
        let open = tally(&[OURS, Unknown, Unknown]);
        assert_eq!(decide(&open, 2, LEFT), Decision::Wait);
        assert_eq!(
            decide(&open.closed(), 2, LEFT),
            Decision::NoQuorum { answered: 1 }
        );
    }

    /// Every way three or five masters can answer, each answer withheld or not: once decided,
    /// the answers that arrive after never turn a take into a refusal or back.
    #[test]
    fn an_answer_after_the_decision_never_changes_whether_it_was_taken() {
        const KINDS: [Answer; 5] = [OURS, RESTARTED, Busy, NotALock, Failed];
        for masters in [3usize, 5] {
            let quorum = masters / 2 + 1;
            for code in 0..KINDS.len().pow(masters as u32) {
                let answers: Vec<Answer> = (0..masters)
                    .map(|i| KINDS[code / KINDS.len().pow(i as u32) % KINDS.len()])
                    .collect();
                let full = decide(&tally(&answers), quorum, LEFT);
                assert_ne!(full, Decision::Wait, "{answers:?}");
                for withheld in 0..1usize << masters {
                    let partial: Vec<Answer> = (0..masters)
                        .map(|i| match withheld >> i & 1 {
                            1 => Unknown,
                            _ => answers[i],
                        })
                        .collect();
                    let early = decide(&tally(&partial), quorum, LEFT);
                    if early != Decision::Wait {
                        let taken = |decision| decision == Decision::Taken;
                        assert_eq!(taken(early), taken(full), "{partial:?} then {answers:?}");
                    }
                }
            }
        }
    }

    #[test]
    fn busy_reports_when_a_majority_is_free_again() {
        let ms = |ms| Some(Duration::from_millis(ms));
        let answers = [
            (2, ms(300), ms(400)),
            (1, ms(100), None),
            (3, ms(200), ms(250)),
        ];
        // Three masters, all busy: free once two are, the second soonest.
        assert_eq!(busy(&answers, 3, 2, None), (1, ms(200), ms(250)));
        // Two of three busy: free once either is.
        assert_eq!(busy(&answers[..2], 3, 2, None), (1, ms(100), None));
        // A racer looks again soon.
        assert_eq!(busy(&answers, 3, 2, ms(25)), (1, ms(25), ms(250)));
        assert_eq!(busy(&[(0, None, None); 2], 3, 2, ms(25)), (0, ms(25), None));
    }

    fn down() -> StoreError {
        StoreError::unavailable("down")
    }

    #[test]
    fn a_step_is_settled_once_a_majority_agrees_or_never_can() {
        assert!(settled(2, 2, 3));
        assert!(!settled(1, 2, 3));
        assert!(settled(1, 3, 3));
        assert!(settled(0, 2, 3));
        assert!(!settled(0, 1, 3));
        assert!(!settled(2, 4, 5));
        assert!(settled(2, 5, 5));
        assert!(settled(3, 3, 5));
    }

    #[test]
    fn a_step_needs_a_majority_to_answer_and_says_why_it_had_none() {
        assert!(majority_answered(&[(0, Ok(1)), (1, Err(down())), (2, Ok(2))], 2).is_ok());
        let short = majority_answered(&[(0, Ok(1)), (1, Err(down())), (2, Err(down()))], 2);
        assert!(
            matches!(short, Err(StoreError::Unavailable(_))),
            "{short:?}"
        );
        let unanswered = majority_answered(&[(0, Ok(1))], 2);
        assert!(
            matches!(
                unanswered,
                Err(StoreError::NoQuorum {
                    answered: 1,
                    needed: 2
                })
            ),
            "{unanswered:?}"
        );
    }

    #[test]
    fn a_renewal_is_decided_by_a_majority_either_way_and_fails_otherwise() {
        use Renewal::{Extended, Failed, Lost};
        let renewals = |outcomes: &[Renewal]| Renewals::of(outcomes);
        let extended = renewals(&[Extended, Lost(LostReason::Gone), Extended]);
        assert!(extended.decided(2));
        assert!(matches!(extended.outcome(2), Extended));
        let gone = renewals(&[Lost(LostReason::Gone), Lost(LostReason::Gone)]);
        assert!(matches!(gone.outcome(2), Lost(LostReason::Gone)));
        let taken = renewals(&[Lost(LostReason::Gone), Extended, Lost(LostReason::Taken)]);
        assert!(matches!(taken.outcome(2), Lost(LostReason::Taken)));
        let split = renewals(&[Extended, Lost(LostReason::Gone), Failed(down())]);
        assert!(!split.decided(2));
        assert!(matches!(
            split.outcome(2),
            Failed(StoreError::Unavailable(_))
        ));
        let unanswered = renewals(&[Extended]);
        assert!(matches!(
            unanswered.outcome(2),
            Failed(StoreError::NoQuorum {
                answered: 1,
                needed: 2
            })
        ));
    }

    #[test]
    fn a_hand_over_is_handed_on_a_majority_and_otherwise_what_a_majority_says() {
        use HandOver::{Handed, NotOurs, Released, ToReservation};
        let outcome = |answers: &[Result<HandOver, StoreError>]| HandOvers::of(answers).outcome(2);
        assert_eq!(
            outcome(&[Ok(Handed), Ok(NotOurs), Ok(Handed)]),
            Some(Handed)
        );
        assert_eq!(
            outcome(&[Ok(Handed), Ok(NotOurs), Ok(NotOurs)]),
            Some(NotOurs)
        );
        assert_eq!(
            outcome(&[Ok(ToReservation), Err(down()), Ok(ToReservation)]),
            Some(ToReservation)
        );
        // Gone from a majority: freed on one, handed (and taken back) or passed on elsewhere.
        assert_eq!(
            outcome(&[Ok(Handed), Ok(Released), Err(down())]),
            Some(Released)
        );
        assert_eq!(
            outcome(&[Ok(ToReservation), Ok(Released), Ok(NotOurs)]),
            Some(Released)
        );
        assert_eq!(outcome(&[Ok(Handed), Ok(NotOurs), Err(down())]), None);
        assert_eq!(
            HandOvers::of(&[Ok(Handed), Ok(NotOurs), Err(down())]).answered(),
            2
        );
    }
}

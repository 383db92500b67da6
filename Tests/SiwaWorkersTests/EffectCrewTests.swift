import SiwaWorkers
import Testing

/// Who claims among a process's effect workers: a steady flow in few large batches, and no wake
/// lost on the way (a job left to a busy worker is claimed by it, not by the next poll).
@Suite("Effect workers: one claims for the flow, all for a backlog", .timeLimit(.minutes(10)))
struct EffectCrewTests {
    @Test("A worker woken while another is mid-round leaves the jobs to it; that one claims again even after an empty claim")
    func wakePassedOn() {
        let crew = EffectCrew(batchSize: 200)
        let now = ContinuousClock.now  // one instant: every round here is young
        #expect(crew.begin(now: now))  // worker 1 claims
        #expect(!crew.begin(now: now))  // worker 2, woken by the next commit: left to worker 1
        #expect(crew.end(claimed: 0))  // worker 1's claim ran before that commit: it claims once more
        #expect(crew.begin(now: now))
        #expect(crew.end(claimed: 30))  // it took them; it goes on while it finds jobs
        #expect(crew.begin(now: now))
        #expect(!crew.end(claimed: 0))  // nothing new, nothing passed on: it waits for the doorbell
    }

    @Test("After a full batch every woken worker claims, until a round comes back short")
    func backlogBringsEveryone() {
        let crew = EffectCrew(batchSize: 200)
        let now = ContinuousClock.now  // one instant: every round here is young
        #expect(crew.begin(now: now))
        #expect(crew.end(claimed: 200))
        #expect(crew.begin(now: now) && crew.begin(now: now) && crew.begin(now: now))  // three workers now claim side by side
        #expect(crew.end(claimed: 200) && crew.end(claimed: 120))
        #expect(!crew.begin(now: now))  // the last round to end was short: a new wake is left to the one still claiming
        #expect(crew.end(claimed: 0))  // which claims again for it
    }

    @Test("A round that began 50 ms ago or more (slow, or stalled on a lock) holds no one back")
    func slowRoundHoldsNoOneBack() {
        let crew = EffectCrew(batchSize: 200, patience: .milliseconds(50))
        let start = ContinuousClock.now
        #expect(crew.begin(now: start))
        #expect(!crew.begin(now: start + .milliseconds(49)))
        #expect(crew.begin(now: start + .milliseconds(50)))  // claims beside the slow one
        #expect(!crew.begin(now: start + .milliseconds(60)))  // and is the latest round now
    }

    @Test("A failed round leaves a passed-on wake for the next round that ends")
    func failedRoundKeepsTheWake() {
        let crew = EffectCrew(batchSize: 200)
        let now = ContinuousClock.now  // one instant: every round here is young
        #expect(crew.begin(now: now))
        #expect(!crew.begin(now: now))
        crew.abandon()
        #expect(crew.begin(now: now))  // no one is mid-round now
        #expect(crew.end(claimed: 0))  // and the wake left earlier still makes it claim again
    }
}

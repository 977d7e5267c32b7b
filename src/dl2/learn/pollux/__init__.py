"""DL2 in the Pollux world (issue 35): a decision environment over the world's own interval loop, its
features, a policy that runs a decision function through `dl2.pollux.cluster.simulate`, teachers'
demonstrations, and environments stepped together."""

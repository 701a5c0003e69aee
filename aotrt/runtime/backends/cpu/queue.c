
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>

#define AOTRT_RING %(ring)d

typedef struct {
    int64_t kind;        /* 1: native steps, 2: Python, 3: stop */
    void **P;            /* aotrt_run_steps's pointers (P[2], P[3]: failed step, code) */
    int64_t n, threads;
    void *wait;          /* int (*)(void *): the dnnl stream's wait, after the steps */
} aotrt_job;

typedef struct {
    int64_t done;        /* jobs finished; first, so Python may read it */
    int64_t failed;      /* a job failed: native jobs are skipped until it is cleared */
    int64_t pushed, taken;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    aotrt_job ring[AOTRT_RING];
} aotrt_queue;

void *aotrt_queue_new(void) {
    aotrt_queue *q = (aotrt_queue *)calloc(1, sizeof(aotrt_queue));
    if (!q) return 0;
    if (pthread_mutex_init(&q->mu, 0)) { free(q); return 0; }
    if (pthread_cond_init(&q->cv, 0)) { pthread_mutex_destroy(&q->mu); free(q); return 0; }
    return q;
}

void aotrt_queue_free(void *p) {
    aotrt_queue *q = (aotrt_queue *)p;
    pthread_cond_destroy(&q->cv);
    pthread_mutex_destroy(&q->mu);
    free(q);
}

/* The job's sequence number (1, 2, ...), or 0 where the ring is full (never blocks). */
int64_t aotrt_queue_push(void *p, int64_t kind, void **P, int64_t n, int64_t threads,
                         void *wait) {
    aotrt_queue *q = (aotrt_queue *)p;
    pthread_mutex_lock(&q->mu);
    if (q->pushed - q->taken >= AOTRT_RING) { pthread_mutex_unlock(&q->mu); return 0; }
    aotrt_job *j = &q->ring[q->pushed %% AOTRT_RING];
    j->kind = kind; j->P = P; j->n = n; j->threads = threads; j->wait = wait;
    int64_t seq = ++q->pushed;
    pthread_cond_broadcast(&q->cv);
    pthread_mutex_unlock(&q->mu);
    return seq;
}

void aotrt_queue_room(void *p) {
    aotrt_queue *q = (aotrt_queue *)p;
    pthread_mutex_lock(&q->mu);
    while (q->pushed - q->taken >= AOTRT_RING) pthread_cond_wait(&q->cv, &q->mu);
    pthread_mutex_unlock(&q->mu);
}

/* The worker's loop: runs native jobs as they come, and returns the kind of the first
   other one (Python, stop), which the caller marks finished with aotrt_queue_finish. */
int64_t aotrt_queue_next(void *p) {
    aotrt_queue *q = (aotrt_queue *)p;
    pthread_mutex_lock(&q->mu);
    for (;;) {
        while (q->taken == q->pushed) pthread_cond_wait(&q->cv, &q->mu);
        aotrt_job j = q->ring[q->taken %% AOTRT_RING];
        q->taken++;
        pthread_cond_broadcast(&q->cv);
        if (j.kind != 1) { pthread_mutex_unlock(&q->mu); return j.kind; }
        int64_t skip = q->failed;
        pthread_mutex_unlock(&q->mu);
        int64_t *failed = (int64_t *)j.P[2], *code = (int64_t *)j.P[3];
        if (!skip) {
            *failed = 0; *code = 0;
            aotrt_run_steps(j.P, 0, j.n, j.threads);
            if (!*failed && j.wait) {
                int c = ((int (*)(void *))j.wait)(j.P[1]);
                if (c) { *failed = j.n + 1; *code = c; }
            }
        }
        pthread_mutex_lock(&q->mu);
        if (!skip && *failed) q->failed = 1;
        q->done++;
        pthread_cond_broadcast(&q->cv);
    }
}

void aotrt_queue_finish(void *p, int64_t failed) {
    aotrt_queue *q = (aotrt_queue *)p;
    pthread_mutex_lock(&q->mu);
    if (failed) q->failed = 1;
    q->done++;
    pthread_cond_broadcast(&q->cv);
    pthread_mutex_unlock(&q->mu);
}

void aotrt_queue_wait(void *p, int64_t seq) {
    aotrt_queue *q = (aotrt_queue *)p;
    pthread_mutex_lock(&q->mu);
    while (q->done < seq) pthread_cond_wait(&q->cv, &q->mu);
    pthread_mutex_unlock(&q->mu);
}

/* The worker is gone: every wait returns (the stream reports why). */
void aotrt_queue_abandon(void *p) {
    aotrt_queue *q = (aotrt_queue *)p;
    pthread_mutex_lock(&q->mu);
    q->failed = 1;
    q->done = INT64_MAX;
    pthread_cond_broadcast(&q->cv);
    pthread_mutex_unlock(&q->mu);
}

/* Whether a job failed since the last call; clears it. */
int64_t aotrt_queue_take_failed(void *p) {
    aotrt_queue *q = (aotrt_queue *)p;
    pthread_mutex_lock(&q->mu);
    int64_t f = q->failed;
    q->failed = 0;
    pthread_mutex_unlock(&q->mu);
    return f;
}

int64_t aotrt_queue_failed(void *p) {
    aotrt_queue *q = (aotrt_queue *)p;
    pthread_mutex_lock(&q->mu);
    int64_t f = q->failed;
    pthread_mutex_unlock(&q->mu);
    return f;
}

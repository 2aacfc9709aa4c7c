// Golden data from the reference llama.cpp, through its public C API (llama.h).
//
// Built and run by scripts/golden/forward.py; not part of the test suite.
//
//   llama_golden MODEL tokenize TEXT_FILE            ids of the text (BOS as the model says, special tokens parsed)
//   llama_golden MODEL logits IDS_FILE OUT.f32       feed the ids one token per llama_decode call and write the
//                                                    logits of every position (n x n_vocab little-endian f32)
//   llama_golden MODEL greedy IDS_FILE N             prefill the ids in one batch, then pick the argmax N times
//                                                    (what llama-completion --temp 0 does); prints the new ids
//   llama_golden MODEL dump IDS_FILE DIR NAME...     token by token; every F32 intermediate whose graph name is
//                                                    one of NAME (e.g. Qcur-0) is written to DIR/NAME.POS.K.f32,
//                                                    K counting the tensors of that name in one step (debugging)
//
// IDS_FILE holds whitespace-separated token ids. Single-threaded, so runs are reproducible.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ggml.h"
#include "llama.h"

static void die(const char *msg) {
    fprintf(stderr, "llama_golden: %s\n", msg);
    exit(1);
}

static char *read_file(const char *path, long *len) {
    FILE *f = fopen(path, "rb");
    if (!f) die("cannot open input file");
    fseek(f, 0, SEEK_END);
    *len = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *buf = malloc(*len + 1);
    if (fread(buf, 1, *len, f) != (size_t)*len) die("short read");
    buf[*len] = 0;
    fclose(f);
    return buf;
}

static llama_token *read_ids(const char *path, int *n) {
    long len;
    char *text = read_file(path, &len);
    llama_token *ids = malloc(sizeof(llama_token) * (len / 2 + 1));
    *n = 0;
    for (char *p = strtok(text, " \t\r\n,[]"); p; p = strtok(NULL, " \t\r\n,[]")) ids[(*n)++] = atoi(p);
    free(text);
    return ids;
}

static struct llama_context *make_context(struct llama_model *model, int n_ctx, int n_batch) {
    struct llama_context_params cp = llama_context_default_params();
    cp.n_ctx = n_ctx;
    cp.n_batch = n_batch;
    cp.n_ubatch = n_batch;
    cp.n_threads = 1;
    cp.n_threads_batch = 1;
    struct llama_context *ctx = llama_init_from_model(model, cp);
    if (!ctx) die("cannot create context");
    return ctx;
}

struct dump_state {
    const char *dir;
    char **names;
    int n_names;
    int pos;
    int seen[64];
};

static bool dump_cb(struct ggml_tensor *t, bool ask, void *user) {
    struct dump_state *d = user;
    for (int i = 0; i < d->n_names && i < 64; i++) {
        if (strcmp(t->name, d->names[i]) != 0) continue;
        if (ask) return true;
        if (t->type == GGML_TYPE_F32 && ggml_is_contiguous(t)) {
            char path[1024];
            snprintf(path, sizeof path, "%s/%s.%d.%d.f32", d->dir, t->name, d->pos, d->seen[i]++);
            FILE *f = fopen(path, "wb");
            if (f) {
                fwrite(t->data, 1, ggml_nbytes(t), f);
                fclose(f);
            }
        }
        return true;
    }
    return ask ? false : true;
}

static int argmax(const float *x, int n) {
    int best = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > x[best]) best = i;
    return best;
}

int main(int argc, char **argv) {
    if (argc < 4) die("usage: llama_golden MODEL (tokenize TEXT | logits IDS OUT | greedy IDS N)");
    llama_backend_init();
    struct llama_model_params mp = llama_model_default_params();
    struct llama_model *model = llama_model_load_from_file(argv[1], mp);
    if (!model) die("cannot load model");
    const struct llama_vocab *vocab = llama_model_get_vocab(model);
    const int n_vocab = llama_vocab_n_tokens(vocab);
    const char *mode = argv[2];

    if (strcmp(mode, "tokenize") == 0) {
        long len;
        char *text = read_file(argv[3], &len);
        int cap = (int)len + 16;
        llama_token *ids = malloc(sizeof(llama_token) * cap);
        int n = llama_tokenize(vocab, text, (int)len, ids, cap, true, true);
        if (n < 0) die("tokenize failed");
        for (int i = 0; i < n; i++) printf("%s%d", i ? " " : "", ids[i]);
        printf("\n");
    } else if (strcmp(mode, "logits") == 0 && argc == 5) {
        int n;
        llama_token *ids = read_ids(argv[3], &n);
        struct llama_context *ctx = make_context(model, n + 8, 1);
        FILE *out = fopen(argv[4], "wb");
        if (!out) die("cannot open output");
        for (int i = 0; i < n; i++) {
            if (llama_decode(ctx, llama_batch_get_one(&ids[i], 1)) != 0) die("decode failed");
            const float *logits = llama_get_logits_ith(ctx, -1);
            fwrite(logits, sizeof(float), n_vocab, out);
        }
        fclose(out);
        llama_free(ctx);
    } else if (strcmp(mode, "greedy") == 0 && argc == 5) {
        int n;
        llama_token *ids = read_ids(argv[3], &n);
        int n_gen = atoi(argv[4]);
        struct llama_context *ctx = make_context(model, n + n_gen + 8, 2048);
        if (llama_decode(ctx, llama_batch_get_one(ids, n)) != 0) die("prefill failed");
        for (int i = 0; i < n_gen; i++) {
            llama_token t = argmax(llama_get_logits_ith(ctx, -1), n_vocab);
            printf("%s%d", i ? " " : "", t);
            if (llama_vocab_is_eog(vocab, t)) break;
            if (llama_decode(ctx, llama_batch_get_one(&t, 1)) != 0) die("decode failed");
        }
        printf("\n");
        llama_free(ctx);
    } else if (strcmp(mode, "dump") == 0 && argc >= 6) {
        int n;
        llama_token *ids = read_ids(argv[3], &n);
        struct dump_state d = {.dir = argv[4], .names = argv + 5, .n_names = argc - 5};
        struct llama_context_params cp = llama_context_default_params();
        cp.n_ctx = n + 8;
        cp.n_batch = cp.n_ubatch = 1;
        cp.n_threads = cp.n_threads_batch = 1;
        cp.cb_eval = dump_cb;
        cp.cb_eval_user_data = &d;
        struct llama_context *ctx = llama_init_from_model(model, cp);
        if (!ctx) die("cannot create context");
        for (int i = 0; i < n; i++) {
            d.pos = i;
            memset(d.seen, 0, sizeof d.seen);
            if (llama_decode(ctx, llama_batch_get_one(&ids[i], 1)) != 0) die("decode failed");
        }
        llama_free(ctx);
    } else {
        die("unknown mode or wrong arguments");
    }
    llama_model_free(model);
    return 0;
}
